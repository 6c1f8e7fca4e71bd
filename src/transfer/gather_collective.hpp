// The data path of the CP layer gather (protocols/layer_gather.cpp) when it is not MPI:
// engine.collectives = nccl posts each layer's all-gather through this interface (NCCL on the GPU,
// staged through device buffers: cuda/nccl.hpp) and waits on the returned event. MPI stays for
// control, and is the data path when no collective is made (engine.collectives = mpi).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>

#include "transfer/transfer_engine.hpp"

namespace kvgrid::transfer {

class GatherCollective {
 public:
  virtual ~GatherCollective() = default;
  virtual std::string_view name() const = 0;
  // recv (size × bytes, rank r's at r × bytes) ← every group rank's send (bytes), through buffer
  // slot `slot` (0/1: two layers in flight). Host buffers, untouched by the caller until the event.
  virtual Event post(int slot, const void* send, void* recv, std::size_t bytes) = 0;
};

// nullptr for "mpi"; for "nccl" a communicator over `group` (collective: every rank of the group
// calls it; the unique id goes over MPI from the group's rank 0). InputError when this build has no NCCL.
std::unique_ptr<GatherCollective> make_gather_collective(const std::string& name, MPI_Comm group);

}  // namespace kvgrid::transfer
