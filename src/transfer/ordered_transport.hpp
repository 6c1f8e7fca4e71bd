// A KvTransport over a data plane that matches messages by posting order alone — NCCL's
// point-to-point has no tags — with MPI for control (engine.collectives = nccl; "mpi_ordered" runs
// the same matching over an MPI data plane, so every P/D test can exercise it without a GPU).
//
// Invariant: a receive gets the bytes of the sender's message with the same (peer, tag) in the
// order the sender posted them — what the MPI transport guarantees — although the data plane
// pairs operations only by order. How:
//  * a send first announces (tag, bytes) to its peer on MPI (the transport's own communicator), then
//    posts its data on the plane: announcements and data leave a sender in the same order;
//  * the receiver takes announcements in arrival order (MPI's non-overtaking rule: the sender's
//    order) and posts one data receive per announcement, in that order: into the oldest posted
//    receive with that tag, or — none posted yet — into a holding buffer that the first later
//    receive with that tag takes (MPI's unexpected messages);
//  * a cancelled receive matches nothing; a message announced after it is held for a later receive,
//    as a cancelled MPI receive leaves its message to the next matching one.
// Progress is made whenever a receive is posted, queried or waited for, and at every poll of a wait
// on the thread that built the transport (core/wait.hpp's progress hooks).
// What a plane must provide: per pair of ranks, order; across pairs, independence — one peer's
// pending operation never holds back another peer's (the NCCL plane: a communicator per pair).
// Buggy variant (jobs/mutants.txt ordered_transport_ignores_tags): pairing by order alone, as NCCL
// does — layers posted in another order land in the wrong pages.
#pragma once

#include <mpi.h>

#include <memory>
#include <span>
#include <string_view>

#include "transfer/kv_transport.hpp"

namespace kvgrid::transfer {

// Posting-order data movement between ranks of one communicator: the n-th send to a peer meets the
// peer's n-th receive from this rank (their block sizes sum to the same bytes).
class DataPlane {
 public:
  virtual ~DataPlane() = default;
  virtual std::string_view name() const = 0;
  virtual Event send(int peer, std::span<const Block> blocks) = 0;
  virtual Event recv(int peer, std::span<const Block> blocks) = 0;
};

// MPI on one data tag (posting order only, as NCCL): the "mpi_ordered" plane.
std::unique_ptr<DataPlane> make_mpi_ordered_plane(MPI_Comm comm);
// NCCL between this rank and each of `peers` (ranks of comm; the relation must be symmetric: a
// peer lists this rank too): a two-rank communicator per pair, built from ids exchanged over comm
// (every rank of comm calls it, an empty list included). One communicator for all would serialize
// every peer's operations in one order, and ranks that queued two peers' messages in different
// orders would wait for each other. InputError without NCCL.
std::unique_ptr<DataPlane> make_nccl_plane(MPI_Comm comm, std::vector<int> peers);

std::unique_ptr<KvTransport> make_ordered_transport(MPI_Comm comm, std::unique_ptr<DataPlane> plane);

}  // namespace kvgrid::transfer
