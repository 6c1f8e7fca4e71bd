#include "protocols/layer_gather.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/check.hpp"
#include "core/wait.hpp"

namespace kvgrid::protocols {

namespace {
using Clock = std::chrono::steady_clock;
std::uint64_t since(Clock::time_point t) {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count());
}
}  // namespace

GatherOrder parse_gather_order(const std::string& name) {
  if (name == "after_restore") return GatherOrder::AfterRestore;
  KVGRID_CHECK(name == "before_restore_event", "unknown protocol.layer_gather variant '", name, "'");
  return GatherOrder::BeforeRestoreEvent;
}

void LayerGather::restore_then_post(std::size_t layer, const std::function<void(std::size_t)>& before_layer) {
  if (cfg_.order == GatherOrder::AfterRestore) {
    if (before_layer) before_layer(layer);
    post(layer);
    return;
  }
  post(layer);  // the bug: the owners' pages are copied into the send buffer before the copy landed
  if (before_layer) before_layer(layer);
}

LayerGather::LayerGather(Config cfg, const ShardGroup& group, const cache::KvPool& pool)
    : cfg_(cfg), group_(group), pool_(pool) {
  KVGRID_CHECK(group_.size > 1 && group_.comm != MPI_COMM_NULL, "a layer gather needs a shard group");
  KVGRID_CHECK(cfg_.slot_pages.value() >= group_.size, "gather slot of ", cfg_.slot_pages, " pages for ", group_.size,
               " owners");
  const auto& pc = pool_.config();
  for (int s = 0; s < 2; ++s)
    slots_.emplace_back(cache::KvPoolConfig{cfg_.slot_pages, pc.page_size, pc.layer_base, 1, pc.heads, pc.dims, pc.payload});
  out_.resize(pool_.heads());
}

void LayerGather::post(std::size_t layer) {
  const std::size_t words = pool_.layer_block_bytes() / sizeof(std::uint64_t);
  auto& send = send_[layer % 2];
  send.assign(block_ * words, 0);  // padding rows stay zero (the padding page)
  for (std::size_t j = 0; j < mine_.size(); ++j)
    std::memcpy(send.data() + j * words, pool_.layer_block(mine_[j], layer), words * sizeof(std::uint64_t));
  const std::size_t bytes = block_ * words * sizeof(std::uint64_t);
  KVGRID_CHECK(bytes <= static_cast<std::size_t>(INT32_MAX), "gather of ", bytes, " bytes per rank");
  std::uint64_t* recv = slots_[layer % 2].layer_block(PageId(1), 0);
  if (cfg_.collective)
    collective_[layer % 2] = cfg_.collective->post(static_cast<int>(layer % 2), send.data(), recv, bytes);
  else
    KVGRID_MPI_CHECK(MPI_Iallgather(send.data(), static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE,
                                  group_.comm, &req_[layer % 2]));
  stats_.pages += block_ * group_.size;
  stats_.bytes += bytes * group_.size;
  ++stats_.layers;
}

void LayerGather::fold(std::span<const GatherItem> items, std::size_t layer, MPI_Request* drive) {
  const std::size_t H = pool_.heads();
  const cache::KvPool& slot = slots_[layer % 2];
  for (std::size_t i = 0; i < items.size(); ++i) {
    std::fill(out_.begin(), out_.end(), 0);
    const auto& rows = rows_[i];
    const bool partial = items[i].tail_tokens > 0 && slot.payload() == cache::Payload::Full && !rows.empty();
    const std::size_t whole = rows.size() - (partial ? 1 : 0);
    if (partial) slot.fold_slots(rows.back(), items[i].tail_tokens, rows.size() - 1, out_);  // its written slots only
    for (std::size_t at = 0; at < whole; at += cfg_.test_every) {
      const std::size_t n = std::min(cfg_.test_every, whole - at);
      slot.fold_pages(std::span<const std::uint32_t>(rows).subspan(at, n), out_, /*first_index=*/at);
      if (drive && *drive != MPI_REQUEST_NULL) {
        int done = 0;
        KVGRID_MPI_CHECK(MPI_Test(drive, &done, MPI_STATUS_IGNORE));
      }
    }
    for (std::size_t h = 0; h < H; ++h) items[i].run[layer * H + h] += out_[h];
  }
}

std::uint64_t LayerGather::run(std::span<const GatherItem> items, const std::function<void(std::size_t)>& before_layer) {
  const auto t0 = Clock::now();
  const std::uint32_t N = group_.size, me = group_.rank;
  // The plan: pages grouped by owner, each owner's in prefix order; row = 1 + owner·block + index.
  std::vector<std::size_t> count(N, 0);
  mine_.clear();
  rows_.assign(items.size(), {});
  std::vector<std::vector<std::pair<std::uint32_t, std::size_t>>> at(items.size());
  for (std::size_t i = 0; i < items.size(); ++i)
    for (PageId q : items[i].pages) {
      const std::uint32_t r = pool_.placement().page_owner(q.value());
      at[i].push_back({r, count[r]++});
      if (r == me) mine_.push_back(q);
    }
  block_ = *std::max_element(count.begin(), count.end());
  if (block_ == 0) return 0;
  KVGRID_CHECK(static_cast<std::int64_t>(block_ * N) <= cfg_.slot_pages.value(), "gather of ", block_ * N,
               " pages into a slot of ", cfg_.slot_pages, " (admission should have refused the batch)");
  for (std::size_t i = 0; i < items.size(); ++i)
    for (const auto& [r, j] : at[i]) rows_[i].push_back(static_cast<std::uint32_t>(1 + r * block_ + j));
  ++stats_.batches;

  const std::size_t L = pool_.layers();
  auto wait = [&](std::size_t l) {
    const auto tw = Clock::now();
    if (cfg_.collective)
      collective_[l % 2].synchronize();
    else
      wait_mpi(&req_[l % 2], "MPI_Iallgather of layer " + std::to_string(l) + " of the cached prefix");
    stats_.blocked_ns += since(tw);
  };
  if (cfg_.overlap) {
    restore_then_post(0, before_layer);
    for (std::size_t l = 0; l < L; ++l) {
      wait(l);
      if (l + 1 < L) restore_then_post(l + 1, before_layer);  // into the other slot, read two layers ago
      fold(items, l, l + 1 < L ? &req_[(l + 1) % 2] : nullptr);
    }
  } else {
    for (std::size_t l = 0; l < L; ++l) {
      restore_then_post(l, before_layer);
      wait(l);
      fold(items, l, nullptr);
    }
  }
  stats_.total_ns += since(t0);
  return block_ * N * pool_.layer_block_bytes();
}

}  // namespace kvgrid::protocols
