// The step message's encoding of arrivals and session events (serve_workload.hpp): what PP0's
// leader sends every rank, as flat words.
#include "runtime/serve_workload.hpp"

#include "core/check.hpp"

namespace kvgrid {

std::vector<std::uint32_t> encode_specs(std::span<const RequestSpec> reqs) {
  std::size_t words = 1;
  for (const auto& r : reqs) words += 9 + r.prompt.size();
  std::vector<std::uint32_t> buf;
  buf.reserve(words);
  buf.push_back(static_cast<std::uint32_t>(reqs.size()));
  for (const auto& r : reqs) {
    buf.insert(buf.end(), {static_cast<std::uint32_t>(r.id.value()), static_cast<std::uint32_t>(r.id.value() >> 32),
                           static_cast<std::uint32_t>(r.arrival_ns), static_cast<std::uint32_t>(r.arrival_ns >> 32),
                           r.round, r.output_len, static_cast<std::uint32_t>(r.session),
                           static_cast<std::uint32_t>(r.session >> 32), static_cast<std::uint32_t>(r.prompt.size())});
    buf.insert(buf.end(), r.prompt.begin(), r.prompt.end());
  }
  return buf;
}

std::vector<RequestSpec> decode_specs(std::span<const std::uint32_t> buf) {
  KVGRID_CHECK(!buf.empty(), "empty request buffer");
  std::vector<RequestSpec> out(buf[0]);
  std::size_t pos = 1;
  for (auto& r : out) {
    KVGRID_CHECK(pos + 9 <= buf.size(), "truncated request buffer");
    r.id = RequestId(buf[pos] | (static_cast<std::uint64_t>(buf[pos + 1]) << 32));
    r.arrival_ns = buf[pos + 2] | (static_cast<std::uint64_t>(buf[pos + 3]) << 32);
    r.round = buf[pos + 4];
    r.output_len = buf[pos + 5];
    r.session = buf[pos + 6] | (static_cast<std::uint64_t>(buf[pos + 7]) << 32);
    const std::size_t n = buf[pos + 8];
    pos += 9;
    KVGRID_CHECK(pos + n <= buf.size(), "truncated request buffer");
    r.prompt.assign(buf.begin() + static_cast<std::ptrdiff_t>(pos), buf.begin() + static_cast<std::ptrdiff_t>(pos + n));
    pos += n;
  }
  KVGRID_CHECK(pos == buf.size(), "request buffer has trailing words");
  return out;
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> encode_session_events(std::span<const SessionEvent> ev) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  for (const auto& e : ev) out.emplace_back(static_cast<std::uint64_t>(e.kind), e.session);
  return out;
}

std::vector<SessionEvent> decode_session_events(std::span<const std::pair<std::uint64_t, std::uint64_t>> ev) {
  std::vector<SessionEvent> out;
  for (const auto& [k, id] : ev) {
    KVGRID_CHECK((k == SessionEvent::Open || k == SessionEvent::Close) && id != 0, "malformed session event (", k, ", ", id, ")");
    out.push_back(SessionEvent{static_cast<SessionEvent::Kind>(k), id});
  }
  return out;
}

}  // namespace kvgrid
