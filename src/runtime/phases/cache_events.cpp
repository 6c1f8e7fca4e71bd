// Phase `cache_events`: the cache decisions a later stage follows rather than takes (the prefetch
// stops and admissions PP0 relayed, protocol.prefetch_consensus and device.alloc.fail under
// pp_sync), then the agreed write ACKs — every rank, every step: PP0's stage agrees, later stages
// consume the count relayed with the inputs (protocol.pp_sync).
#include "runtime/serve_loop.hpp"

namespace kvgrid {

void ServeLoop::cache_events(Step& s) {
  if (auto* st = dc_.storage_tier(); st && !first_stage_) st->set_decisions(s.in.stops);
  if (stack_.relay_admissions && !first_stage_) dc_.follow_admissions(s.in.admits);
  if (auto* acks = dc_.write_acks()) {
    s.write_acks = static_cast<std::uint32_t>(
        stack_.pp_sync->write_acks(*acks, first_stage_ ? std::nullopt : std::optional<std::uint64_t>(s.in.write_acks)));
    acks->consume(s.write_acks);
  }
}

}  // namespace kvgrid
