// The MPI backend of KvTransport, three ways of moving a message's scattered blocks:
//   datatype   (the default) one operation over an hindexed datatype of the blocks' absolute
//              addresses (from MPI_BOTTOM): no copy of ours, Open MPI's datatype engine pipelines
//              the blocks through its transport;
//   per_block  one MPI_Isend / MPI_Irecv per block (a rendezvous handshake each);
//   staged     packs them into one contiguous buffer, sends it as one message, and the receiver
//              scatters its buffer into the blocks when the receive completes (the event's first
//              query or synchronize after it): two extra copies and a fresh buffer per message.
// kvgrid_bench_pd_transfer measures the three against plain MPI of the same bytes (the README's
// performance section). Waits keep calling MPI (wait_mpi_all's `progressing`): the data moves
// only inside MPI calls.
#include <cstring>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "core/wait.hpp"
#include "transfer/kv_transport.hpp"

namespace kvgrid::transfer {

namespace {

class MpiEvent final : public EventState {
 public:
  MpiEvent(std::string what, std::uint64_t b) : what_(std::move(what)) { bytes = b; }
  bool query() override {
    if (done_) return true;
    int flag = 0;
    KVGRID_MPI_CHECK(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE));
    if (flag) finish();
    return done_;
  }
  void synchronize() override {
    if (done_) return;
    wait_mpi_all(reqs, what_, /*progressing=*/true);
    finish();
  }
  void cancel() override {
    if (done_) return;
    for (auto& r : reqs)
      if (r != MPI_REQUEST_NULL) KVGRID_MPI_CHECK(MPI_Cancel(&r));
    wait_mpi_all(reqs, what_ + " (cancelled)", /*progressing=*/true);
    done_ = true;  // nothing is scattered: the data never came
  }
  std::vector<MPI_Request> reqs;
  // staged receive: the staging buffer and the blocks it is scattered into on completion
  std::vector<char> staging;
  std::vector<Block> scatter;

 private:
  void finish() {
    scatter_into(staging.data(), scatter);
    staging.clear();
    staging.shrink_to_fit();
    done_ = true;
  }
  std::string what_;
  bool done_ = false;
};

class MpiTransport final : public KvTransport {
 public:
  MpiTransport(MPI_Comm comm, MpiMode mode) : comm_(comm), mode_(mode) {}
  std::string_view name() const override {
    return mode_ == MpiMode::Datatype ? "mpi" : mode_ == MpiMode::PerBlock ? "mpi-per-block" : "mpi-staged";
  }
  Event send(int peer, int tag, std::span<const Block> blocks) override { return post(true, peer, tag, blocks); }
  Event recv(int peer, int tag, std::span<const Block> blocks) override { return post(false, peer, tag, blocks); }

 private:
  Event post(bool send, int peer, int tag, std::span<const Block> blocks) {
    std::vector<int> lengths;
    std::vector<MPI_Aint> at;
    std::uint64_t total = 0;
    for (const auto& b : blocks) {
      KVGRID_CHECK(b.bytes <= static_cast<std::size_t>(INT32_MAX), "a KV block of ", b.bytes, " bytes");
      MPI_Aint a = 0;
      KVGRID_MPI_CHECK(MPI_Get_address(b.data, &a));
      lengths.push_back(static_cast<int>(b.bytes));
      at.push_back(a);
      total += b.bytes;
    }
    auto ev = std::make_shared<MpiEvent>(std::string(send ? "KV send of " : "KV receive of ") + std::to_string(total) +
                                             " bytes " + (send ? "to" : "from") + " rank " + std::to_string(peer) +
                                             " (tag " + std::to_string(tag) + ")",
                                         total);
    if (mode_ == MpiMode::Staged) {  // one contiguous message: packed here, scattered on completion
      ev->reqs.resize(1, MPI_REQUEST_NULL);
      ev->staging.resize(total);
      if (send) {
        std::size_t off = 0;
        for (const auto& b : blocks) {
          std::memcpy(ev->staging.data() + off, b.data, b.bytes);
          off += b.bytes;
        }
        KVGRID_MPI_CHECK(MPI_Isend(ev->staging.data(), static_cast<int>(total), MPI_BYTE, peer, tag, comm_, &ev->reqs[0]));
      } else {
        ev->scatter.assign(blocks.begin(), blocks.end());
        KVGRID_MPI_CHECK(MPI_Irecv(ev->staging.data(), static_cast<int>(total), MPI_BYTE, peer, tag, comm_, &ev->reqs[0]));
      }
      return Event(ev);
    }
    if (mode_ == MpiMode::PerBlock) {  // same tag, posting order: block i lands in block i
      ev->reqs.resize(blocks.size(), MPI_REQUEST_NULL);
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        if (send)
          KVGRID_MPI_CHECK(MPI_Isend(blocks[i].data, lengths[i], MPI_BYTE, peer, tag, comm_, &ev->reqs[i]));
        else
          KVGRID_MPI_CHECK(MPI_Irecv(blocks[i].data, lengths[i], MPI_BYTE, peer, tag, comm_, &ev->reqs[i]));
      }
      return Event(ev);
    }
    ev->reqs.resize(1, MPI_REQUEST_NULL);
    MPI_Datatype type;
    KVGRID_MPI_CHECK(MPI_Type_create_hindexed(static_cast<int>(lengths.size()), lengths.data(), at.data(), MPI_BYTE, &type));
    KVGRID_MPI_CHECK(MPI_Type_commit(&type));
    if (send)
      KVGRID_MPI_CHECK(MPI_Isend(MPI_BOTTOM, 1, type, peer, tag, comm_, &ev->reqs[0]));
    else
      KVGRID_MPI_CHECK(MPI_Irecv(MPI_BOTTOM, 1, type, peer, tag, comm_, &ev->reqs[0]));
    KVGRID_MPI_CHECK(MPI_Type_free(&type));  // the posted operation keeps what it needs
    return Event(ev);
  }
  MPI_Comm comm_;
  MpiMode mode_;
};

}  // namespace

std::unique_ptr<KvTransport> make_mpi_transport(MPI_Comm comm, MpiMode mode) {
  return std::make_unique<MpiTransport>(comm, mode);
}

}  // namespace kvgrid::transfer
