#include "runtime/step_message.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "core/wait.hpp"

namespace kvgrid {

namespace {

void put64(Words& w, std::uint64_t v) {
  w.push_back(static_cast<std::uint32_t>(v));
  w.push_back(static_cast<std::uint32_t>(v >> 32));
}
std::uint64_t get64(const Words& w, std::size_t at) { return w[at] | (static_cast<std::uint64_t>(w[at + 1]) << 32); }

constexpr std::size_t kHeaderWords = kStepHeaderWords, kHeadWords = 17, kInlineWords = kHeaderWords - kHeadWords;

}  // namespace

Packed pack(const StepMessage& m) {
  Packed p;
  Words body;
  for (const auto& e : m.entries) {
    put64(body, e.id);
    put64(body, e.start);
    put64(body, e.end);
    put64(body, e.value);
  }
  body.insert(body.end(), m.specs.begin(), m.specs.end());
  for (auto a : m.aborts) put64(body, a);
  for (auto [id, acks] : m.stops) {
    put64(body, id);
    put64(body, acks);
  }
  for (auto a : m.admits) body.push_back(a);
  for (auto [id, n] : m.accepts) {
    put64(body, id);
    put64(body, n);
  }
  for (const auto& t : m.pd)
    for (auto v : t) put64(body, v);
  Words head;
  put64(head, m.clock_ns);
  put64(head, m.exhausted);
  put64(head, m.total);
  std::copy(head.begin(), head.end(), p.header.begin());
  p.header[6] = static_cast<std::uint32_t>(m.entries.size());
  p.header[7] = static_cast<std::uint32_t>(m.specs.size());
  p.header[9] = static_cast<std::uint32_t>(body.size());
  p.header[10] = static_cast<std::uint32_t>(m.aborts.size());
  p.header[11] = m.write_acks;
  p.header[12] = static_cast<std::uint32_t>(m.stops.size());
  p.header[13] = static_cast<std::uint32_t>(m.admits.size());
  p.header[14] = static_cast<std::uint32_t>(m.accepts.size());
  p.header[15] = static_cast<std::uint32_t>(m.pd.size());
  p.header[16] = m.pd_stop;
  if (body.size() <= kInlineWords) {
    p.header[8] = 1;
    std::copy(body.begin(), body.end(), p.header.begin() + kHeadWords);
  } else {
    p.payload = std::move(body);
  }
  return p;
}

StepMessage unpack(const Packed& p) {
  StepMessage m;
  m.clock_ns = get64(p.header, 0);
  m.exhausted = get64(p.header, 2);
  m.total = get64(p.header, 4);
  m.write_acks = p.header[11];
  const std::size_t n = p.header[6], spec_words = p.header[7], size = p.header[9], aborts = p.header[10],
                    stops = p.header[12], admits = p.header[13], accepts = p.header[14], pd = p.header[15];
  m.pd_stop = p.header[16];
  KVGRID_CHECK(size == 8 * n + spec_words + 2 * aborts + 4 * stops + admits + 4 * accepts + 6 * pd, "step message of ", size,
               " words for ", n, " entries, ", spec_words, " spec words, ", aborts, " aborts, ", stops, " prefetch stops, ",
               admits, " admissions, ", accepts, " accepted drafts and ", pd, " P/D records");
  const std::uint32_t* body = p.inline_payload() ? p.header.data() + kHeadWords : p.payload.data();
  KVGRID_CHECK(p.inline_payload() || p.payload.size() == size, "step message payload of ", p.payload.size(), " words, expected ", size);
  Words w(body, body + size);
  for (std::size_t i = 0; i < n; ++i)
    m.entries.push_back({get64(w, 8 * i), get64(w, 8 * i + 2), get64(w, 8 * i + 4), get64(w, 8 * i + 6)});
  m.specs.assign(w.begin() + static_cast<std::ptrdiff_t>(8 * n), w.begin() + static_cast<std::ptrdiff_t>(8 * n + spec_words));
  for (std::size_t i = 0; i < aborts; ++i) m.aborts.push_back(get64(w, 8 * n + spec_words + 2 * i));
  for (std::size_t i = 0, at = 8 * n + spec_words + 2 * aborts; i < stops; ++i, at += 4)
    m.stops.push_back({get64(w, at), get64(w, at + 2)});
  for (std::size_t i = 0, at = 8 * n + spec_words + 2 * aborts + 4 * stops; i < admits; ++i)
    m.admits.push_back(static_cast<std::uint8_t>(w[at + i]));
  for (std::size_t i = 0, at = 8 * n + spec_words + 2 * aborts + 4 * stops + admits; i < accepts; ++i, at += 4)
    m.accepts.push_back({get64(w, at), get64(w, at + 2)});
  for (std::size_t i = 0, at = 8 * n + spec_words + 2 * aborts + 4 * stops + admits + 4 * accepts; i < pd; ++i, at += 6)
    m.pd.push_back({get64(w, at), get64(w, at + 2), get64(w, at + 4)});
  return m;
}

void Sender::send(const StepMessage& m, int dest, MPI_Comm comm, int tag) {
  auto item = std::make_unique<Item>();
  item->p = pack(m);
  KVGRID_MPI_CHECK(MPI_Isend(item->p.header.data(), kHeaderWords, MPI_UINT32_T, dest, tag, comm, &item->req[0]));
  item->req[1] = MPI_REQUEST_NULL;
  if (!item->p.inline_payload())
    KVGRID_MPI_CHECK(MPI_Isend(item->p.payload.data(), static_cast<int>(item->p.payload.size()), MPI_UINT32_T, dest,
                               tag + 1, comm, &item->req[1]));
  items_.push_back(std::move(item));
  while (items_.size() > kMaxInFlight) {
    wait_mpi_all(items_.front()->req, "completion of a send to the next stage");
    items_.pop_front();
  }
  drain(false);
}

void Sender::drain(bool all) {
  while (!items_.empty()) {
    if (all) {
      wait_mpi_all(items_.front()->req, "completion of a send to the next stage");
    } else {
      int done = 0;
      KVGRID_MPI_CHECK(MPI_Testall(2, items_.front()->req, &done, MPI_STATUSES_IGNORE));
      if (!done) return;
    }
    items_.pop_front();
  }
}

StepMessage recv_step(int src, MPI_Comm comm, const std::string& what, int tag) {
  Packed p;
  MPI_Request req;
  KVGRID_MPI_CHECK(MPI_Irecv(p.header.data(), kHeaderWords, MPI_UINT32_T, src, tag, comm, &req));
  wait_mpi(&req, what);
  if (!p.inline_payload()) {
    p.payload.resize(p.header[9]);
    KVGRID_MPI_CHECK(MPI_Irecv(p.payload.data(), static_cast<int>(p.payload.size()), MPI_UINT32_T, src, tag + 1, comm, &req));
    wait_mpi(&req, what + " (payload)");
  }
  return unpack(p);
}

StepMessage bcast_step(const StepMessage& m, bool root, MPI_Comm comm, const std::string& what) {
  Packed p;
  if (root) p = pack(m);
  MPI_Request req;
  KVGRID_MPI_CHECK(MPI_Ibcast(p.header.data(), kHeaderWords, MPI_UINT32_T, 0, comm, &req));
  wait_mpi(&req, what);
  if (!p.inline_payload()) {
    p.payload.resize(p.header[9]);
    KVGRID_MPI_CHECK(MPI_Ibcast(p.payload.data(), static_cast<int>(p.payload.size()), MPI_UINT32_T, 0, comm, &req));
    wait_mpi(&req, what + " (payload)");
  }
  return root ? m : unpack(p);
}


}  // namespace kvgrid
