// The message a pipeline stage sends the next at every step: the step's arrivals and
// aborts (from PP0's leader, relayed stage to stage), the previous stage's activation (per request
// in the batch: the positions computed and the chain value), and the cache decisions later
// stages follow (protocol.pp_sync's write-ACK count, protocol.prefetch_consensus's prefetch
// stops) — each field declared once (visit_fields). A fixed 64-word header carries small payloads inline, so a decode step costs one message
// per hop; larger payloads follow as a second message. Fixed tags from a fixed source: no
// wildcards, no probing. Sends are non-blocking with a bounded number in flight.
#pragma once

#include <mpi.h>

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kvgrid {

using Words = std::vector<std::uint32_t>;

struct StepMessage {
  struct Entry {
    std::uint64_t id, start, end, value;
  };
  std::uint64_t clock_ns = 0, exhausted = 0, total = 0;
  std::uint32_t write_acks = 0;  // protocol.pp_sync: write ACKs the sending stage consumed at this step
  std::vector<Entry> entries;
  Words specs;  // encode_specs() of the arrivals; empty when none arrived
  std::vector<std::uint64_t> aborts;  // requests PP0's leader aborted at this step (request.abort)
  std::vector<std::pair<std::uint64_t, std::uint64_t>> sessions;  // session events (kind, id), before the arrivals
  std::vector<std::pair<std::uint64_t, std::uint64_t>> stops;  // prefetch_consensus: (request, ACKs) PP0 stopped
  std::vector<std::uint8_t> admits;  // pp_sync with device.alloc.fail: PP0's admission outcomes, in order
  // speculative decoding: (request, draft tokens accepted) the last stage verified at the step
  // before; it sends them back to PP0, which relays them forward with the next step's inputs
  std::vector<std::pair<std::uint64_t, std::uint64_t>> accepts;
  // P/D: (kind, request, value) records between the groups' leaders and relayed inside a group
  // (runtime/serve.cpp's PdKind), and the prefill leader's stop
  std::vector<std::array<std::uint64_t, 3>> pd;
  std::uint32_t pd_stop = 0;
};

// Every field of the message, declared once, in wire order: pack and unpack walk this list, so a
// relayed decision is added here and nowhere else. `v.scalar(x)` for a number (header), `v.list(xs)`
// for a vector (its length in the header, its elements in the body).
template <class M, class V>
void visit_fields(M& m, V& v) {
  v.scalar(m.clock_ns);
  v.scalar(m.exhausted);
  v.scalar(m.total);
  v.scalar(m.write_acks);  // protocol.pp_sync: write ACKs consumed at this step
  v.scalar(m.pd_stop);
  v.list(m.entries);       // the activation
  v.list(m.specs);         // arrivals
  v.list(m.aborts);
  v.list(m.sessions);      // session opens and closes
  v.list(m.stops);         // protocol.prefetch_consensus
  v.list(m.admits);        // pp_sync with device.alloc.fail
  v.list(m.accepts);       // speculative decoding
  v.list(m.pd);            // P/D records
}

// Message tags: stage to stage (forward), and the last stage's results back to PP0 (backward).
constexpr int kTagForward = 301, kTagBackward = 311, kTagPdControl = 321;

constexpr std::size_t kStepHeaderWords = 64;

// A packed message: header (with the payload inline when it fits), then the payload otherwise.
struct Packed {
  Words header = Words(kStepHeaderWords, 0);
  Words payload;
  bool inline_payload() const { return header[0] != 0; }
};

Packed pack(const StepMessage& m);
StepMessage unpack(const Packed& p);

// Non-blocking sends whose buffers live here until they complete; at most 32 pending.
class Sender {
 public:
  void send(const StepMessage& m, int dest, MPI_Comm comm, int tag = kTagForward);
  void drain(bool all);

 private:
  static constexpr std::size_t kMaxInFlight = 32;
  struct Item {
    Packed p;
    MPI_Request req[2];
  };
  std::deque<std::unique_ptr<Item>> items_;
};

StepMessage recv_step(int src, MPI_Comm comm, const std::string& what, int tag = kTagForward);
StepMessage bcast_step(const StepMessage& m, bool root, MPI_Comm comm, const std::string& what);

}  // namespace kvgrid
