#include "runtime/request_rows.hpp"

#include <algorithm>

namespace kvgrid {

namespace {
RequestRow base_row(const ServeRequest& r) {
  RequestRow row;
  row.request = r.spec.id.value();
  row.round = r.spec.round;
  row.session = r.spec.session;
  row.prompt_tokens = static_cast<std::uint32_t>(r.prompt_len());
  row.output_tokens = r.spec.output_len;
  row.arrival_ns = r.spec.arrival_ns;
  row.admit_ns = r.admit_ns;
  return row;
}
}  // namespace

RequestRow finished_row(const ServeRequest& r, bool pd_decode) {
  RequestRow row = base_row(r);
  row.cached_tokens = static_cast<std::uint32_t>(r.res.matched.value());
  row.host_tokens = static_cast<std::uint32_t>(r.res.host_loaded.value());
  row.storage_tokens = static_cast<std::uint32_t>(r.res.storage_loaded.value());
  row.computed_tokens = static_cast<std::uint32_t>(r.prompt_len() - static_cast<std::size_t>(r.res.matched.value()));
  row.oracle_ok = r.oracle_ok ? 1 : 0;
  row.first_token_ns = r.first_token_ns;
  row.finish_ns = r.finish_ns;
  row.ttft_model_ns = r.first_token_ns - std::min(r.first_token_ns, r.spec.arrival_ns);
  row.queue_ns = r.admit_ns - std::min(r.admit_ns, r.spec.arrival_ns);
  row.forward_ns = r.forward_ns;
  if (pd_decode) row.pd_transferred_tokens = row.computed_tokens;  // the rest came from decode's cache
  row.ttft_wall_ns = r.first_token_wall_ns - std::min(r.first_token_wall_ns, r.seen_wall_ns);
  row.decode_ns = r.finish_ns - std::min(r.finish_ns, r.first_token_ns);
  row.spec_rounds = r.spec_rounds;
  row.spec_proposed = r.spec_proposed;
  row.spec_accepted = r.spec_accepted;
  row.draft_mismatches = r.draft_mismatches;
  return row;
}

RequestRow failed_row(const ServeRequest& r, std::int32_t reason, std::uint64_t now_ns) {
  RequestRow row = base_row(r);
  row.failed = reason;
  row.finish_ns = now_ns;
  return row;
}

}  // namespace kvgrid
