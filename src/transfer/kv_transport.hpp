// Point-to-point KV transport between two ranks (P/D disaggregation: a prefill rank sends the KV
// suffix a request's decode peer does not hold, layer by layer). One interface so that NCCL or
// RDMA can replace MPI later; the serving loop only posts sends and receives of (page, layer)
// blocks and waits on their events.
//
//  * `send` / `recv` post one message: the listed blocks, in order, as one unit, with no staging
//    copy. A receive lists blocks of the same sizes as the send's.
//  * Messages between the same two ranks with the same tag arrive in posting order (MPI's
//    non-overtaking rule), so a per-layer tag keeps the layers of successive requests apart.
//  * The returned Event completes when the send's blocks may be reused / the receive's blocks hold
//    the data; `synchronize` blocks through the wait primitive (watchdog included).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "transfer/transfer_engine.hpp"

namespace kvgrid::transfer {

struct Block {
  void* data;
  std::size_t bytes;
};

// A message's bytes: its blocks' sizes summed.
inline std::uint64_t total_bytes(std::span<const Block> blocks) {
  std::uint64_t n = 0;
  for (const auto& b : blocks) n += b.bytes;
  return n;
}
// Copies a contiguous message (`src`, total_bytes(blocks) long) into its blocks, in order.
inline void scatter_into(const char* src, std::span<const Block> blocks) {
  for (const auto& b : blocks) {
    std::memcpy(b.data, src, b.bytes);
    src += b.bytes;
  }
}

class KvTransport {
 public:
  virtual ~KvTransport() = default;
  virtual std::string_view name() const = 0;
  virtual Event send(int peer, int tag, std::span<const Block> blocks) = 0;
  virtual Event recv(int peer, int tag, std::span<const Block> blocks) = 0;
};

// MPI point-to-point over `comm` (peers are ranks of comm; the caller keeps comm alive), moving
// a message's blocks as one derived datatype, one operation per block, or staged through one
// contiguous buffer (mpi_transport.cpp; the benchmark measures them).
enum class MpiMode { Datatype, PerBlock, Staged };
std::unique_ptr<KvTransport> make_mpi_transport(MPI_Comm comm, MpiMode mode = MpiMode::Datatype);

}  // namespace kvgrid::transfer
