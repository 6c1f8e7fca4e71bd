#include "protocols/tp_sync.hpp"

#include <cstdint>

#include "core/agree.hpp"
#include "core/check.hpp"

namespace kvgrid::protocols {

namespace {

std::uint64_t min_over(MPI_Comm comm, std::uint64_t v) { return agree_min(comm, v, "tp_sync all-reduce(MIN)"); }

class MinAllreduce final : public cache::AckAgreement {
 public:
  explicit MinAllreduce(MPI_Comm c) : comm_(c) {}
  std::string_view name() const override { return "min_allreduce"; }
  std::size_t agree(std::size_t ready, std::size_t) override { return min_over(comm_.get(), ready); }
  bool agree_allocation(bool ok) override { return min_over(comm_.get(), ok ? 1 : 0) == 1; }
  std::uint64_t agree_min(std::uint64_t v) override { return min_over(comm_.get(), v); }

 private:
  DupComm comm_;
};

class PerRank final : public cache::AckAgreement {
 public:
  std::string_view name() const override { return "per_rank"; }
  std::size_t agree(std::size_t ready, std::size_t) override { return ready; }
  bool agree_allocation(bool ok) override { return ok; }
  std::uint64_t agree_min(std::uint64_t v) override { return v; }
};

class SkipWhenEmpty final : public cache::AckAgreement {
 public:
  explicit SkipWhenEmpty(MPI_Comm c) : comm_(c) {}
  std::string_view name() const override { return "skip_when_empty"; }
  std::size_t agree(std::size_t ready, std::size_t queue_length) override {
    if (queue_length == 0) return 0;  // the bug: peers with a non-empty queue wait in the collective
    return min_over(comm_.get(), ready);
  }
  bool agree_allocation(bool ok) override { return ok; }
  std::uint64_t agree_min(std::uint64_t v) override { return min_over(comm_.get(), v); }

 private:
  DupComm comm_;
};

}  // namespace

std::unique_ptr<cache::AckAgreement> make_tp_sync(const std::string& variant, MPI_Comm comm) {
  if (variant == "min_allreduce") return std::make_unique<MinAllreduce>(comm);
  if (variant == "per_rank") return std::make_unique<PerRank>();
  if (variant == "skip_when_empty") return std::make_unique<SkipWhenEmpty>(comm);
  throw InputError("unknown protocol.tp_sync variant '" + variant + "' (min_allreduce, per_rank, skip_when_empty)");
}

}  // namespace kvgrid::protocols
