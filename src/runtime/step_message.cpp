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
std::uint64_t get64(const Words& w, std::size_t at) {
  KVGRID_CHECK(at + 1 < w.size(), "step message read past its end (word ", at, " of ", w.size(), ")");
  return w[at] | (static_cast<std::uint64_t>(w[at + 1]) << 32);
}

// Header: word 0 = 1 when the body is inline, word 1 = body words, then the fields' head words.
constexpr std::size_t kHeaderWords = kStepHeaderWords, kFlag = 0, kBodySize = 1, kFirstField = 2;

// Element encodings (the body): 64-bit values as two words, small values as one.
void enc(Words& w, std::uint64_t v) { put64(w, v); }
void enc(Words& w, std::uint32_t v) { w.push_back(v); }
void enc(Words& w, std::uint8_t v) { w.push_back(v); }
void enc(Words& w, const std::pair<std::uint64_t, std::uint64_t>& v) {
  put64(w, v.first);
  put64(w, v.second);
}
void enc(Words& w, const std::array<std::uint64_t, 3>& v) {
  for (auto x : v) put64(w, x);
}
void enc(Words& w, const StepMessage::Entry& e) {
  for (auto x : {e.id, e.start, e.end, e.value}) put64(w, x);
}
void dec(const Words& w, std::size_t& at, std::uint64_t& v) {
  v = get64(w, at);
  at += 2;
}
void dec(const Words& w, std::size_t& at, std::uint32_t& v) {
  KVGRID_CHECK(at < w.size(), "step message read past its end");
  v = w[at++];
}
void dec(const Words& w, std::size_t& at, std::uint8_t& v) {
  KVGRID_CHECK(at < w.size(), "step message read past its end");
  v = static_cast<std::uint8_t>(w[at++]);
}
void dec(const Words& w, std::size_t& at, std::pair<std::uint64_t, std::uint64_t>& v) {
  dec(w, at, v.first);
  dec(w, at, v.second);
}
void dec(const Words& w, std::size_t& at, std::array<std::uint64_t, 3>& v) {
  for (auto& x : v) dec(w, at, x);
}
void dec(const Words& w, std::size_t& at, StepMessage::Entry& e) {
  for (auto* x : {&e.id, &e.start, &e.end, &e.value}) dec(w, at, *x);
}

// Scalars go into the header (two words each); a list puts its length into the header and its
// elements into the body.
struct Writer {
  Words head, body;
  template <class T>
  void scalar(const T& v) {
    put64(head, static_cast<std::uint64_t>(v));
  }
  template <class T>
  void list(const std::vector<T>& xs) {
    head.push_back(static_cast<std::uint32_t>(xs.size()));
    for (const auto& x : xs) enc(body, x);
  }
};

struct Reader {
  const Words& head;
  const Words& body;
  std::size_t h = 0, b = 0;
  template <class T>
  void scalar(T& v) {
    v = static_cast<T>(get64(head, h));
    h += 2;
  }
  template <class T>
  void list(std::vector<T>& xs) {
    KVGRID_CHECK(h < head.size(), "step message header too short");
    xs.resize(head[h++]);
    for (auto& x : xs) dec(body, b, x);
  }
};

}  // namespace

Packed pack(const StepMessage& m) {
  Writer w;
  visit_fields(m, w);
  Packed p;
  KVGRID_CHECK(kFirstField + w.head.size() <= kHeaderWords, "step message head of ", w.head.size(), " words");
  std::copy(w.head.begin(), w.head.end(), p.header.begin() + kFirstField);
  p.header[kBodySize] = static_cast<std::uint32_t>(w.body.size());
  const std::size_t inline_at = kFirstField + w.head.size();
  if (w.body.size() <= kHeaderWords - inline_at) {
    p.header[kFlag] = 1;
    std::copy(w.body.begin(), w.body.end(), p.header.begin() + static_cast<std::ptrdiff_t>(inline_at));
  } else {
    p.payload = std::move(w.body);
  }
  return p;
}

StepMessage unpack(const Packed& p) {
  StepMessage m;
  // The head's length is fixed by the field list: read it with an empty body first.
  Writer shape;
  visit_fields(m, shape);
  const std::size_t head_words = shape.head.size(), size = p.header[kBodySize];
  const Words head(p.header.begin() + kFirstField, p.header.begin() + static_cast<std::ptrdiff_t>(kFirstField + head_words));
  KVGRID_CHECK(p.inline_payload() ? kFirstField + head_words + size <= kHeaderWords : p.payload.size() == size,
               "step message payload of ", p.payload.size(), " words, expected ", size);
  const Words body = p.inline_payload()
                         ? Words(p.header.begin() + static_cast<std::ptrdiff_t>(kFirstField + head_words),
                                 p.header.begin() + static_cast<std::ptrdiff_t>(kFirstField + head_words + size))
                         : p.payload;
  Reader r{head, body};
  visit_fields(m, r);
  KVGRID_CHECK(r.b == size, "step message of ", size, " body words, its fields read ", r.b);
  return m;
}

std::size_t payload_words(const Packed& p) { return p.header[kBodySize]; }

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
    p.payload.resize(payload_words(p));
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
    p.payload.resize(payload_words(p));
    KVGRID_MPI_CHECK(MPI_Ibcast(p.payload.data(), static_cast<int>(p.payload.size()), MPI_UINT32_T, 0, comm, &req));
    wait_mpi(&req, what + " (payload)");
  }
  return root ? m : unpack(p);
}


}  // namespace kvgrid
