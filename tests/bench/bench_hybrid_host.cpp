// A hybrid model's backup and load-back through the host tier (hybrid_host_tier.hpp) on the
// threaded transfer engine, next to single-threaded memcpy of the same bytes in the same blocks.
// One node per iteration: 64 FULL pages × 4 layers (64 KiB layer blocks: 16 MiB), an SWA window
// of 8 pages (64 KiB each) and one MAMBA state (8 KiB); slot ranges rotate through a 256-page
// pool so that caches do not help. Backup: insert → backup_path → ACK consumed. Load-back: the
// node demoted beforehand; match → plan_load → load → every event synchronized.
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <vector>

#include "cache/hybrid_host_tier.hpp"

namespace kvgrid::cache {
namespace {

using unified::ComponentId;
using unified::InsertValue;
using unified::Slot;

constexpr std::int64_t kPageTokens = 16, kNodePages = 64, kWindowPages = 8, kRanges = 4;
constexpr std::size_t kLayers = 4, kDims = 128, kStateWords = 1024;
const std::vector<std::uint32_t> kHeads{0, 1, 2, 3};

class One final : public AckAgreement {
 public:
  std::string_view name() const override { return "one"; }
  std::size_t agree(std::size_t ready, std::size_t) override { return ready; }
  bool agree_allocation(bool ok) override { return ok; }
  std::uint64_t agree_min(std::uint64_t v) override { return v; }
};

struct Bench {
  DecisionLog log;
  One agreement;
  KvPool full_dev{{Pages(kNodePages * kRanges), Tokens(kPageTokens), 0, kLayers, kHeads, kDims, Payload::Full}};
  KvPool full_host{{Pages(kNodePages * kRanges), Tokens(kPageTokens), 0, kLayers, kHeads, kDims, Payload::Full}};
  KvPool swa_dev{{Pages(kWindowPages * kRanges), Tokens(kPageTokens), 100, 1, kHeads, kDims, Payload::Full}};
  KvPool swa_host{{Pages(kWindowPages * kRanges), Tokens(kPageTokens), 100, 1, kHeads, kDims, Payload::Full}};
  StatePool state_dev{static_cast<std::size_t>(kRanges), kStateWords};
  StatePool state_host{static_cast<std::size_t>(kRanges), kStateWords};
  std::unique_ptr<transfer::TransferEngine> engine;
  unified::UnifiedTree tree{Tokens(kPageTokens)};
  ComponentId full, swa, mamba;
  std::unique_ptr<HybridHostTier> host;
  std::uint32_t next = 0;  // iteration: its tokens and slot range

  Bench() {
    transfer::EngineConfig ec;
    ec.backend = "threaded";
    engine = transfer::make_engine(ec);
    full = tree.add_component(std::make_unique<unified::FullComponent>());
    swa = tree.add_component(std::make_unique<unified::SwaComponent>(Tokens(kWindowPages * kPageTokens)));
    mamba = tree.add_component(std::make_unique<unified::MambaComponent>(Tokens(kPageTokens)));
    HybridHostConfig hc;
    hc.tier.host_pages = Pages(kNodePages * kRanges);
    hc.tier.load_back_threshold = Tokens(kPageTokens);
    hc.swa_pages = kWindowPages * kRanges;
    hc.mamba_slots = kRanges;
    hc.local_layers = kLayers + 2;
    host = std::make_unique<HybridHostTier>(
        hc, tree, std::vector<ComponentKind>{ComponentKind::Full, ComponentKind::Swa, ComponentKind::Mamba},
        HybridBytes{&full_dev, &full_host, &swa_dev, &swa_host, &state_dev, &state_host}, std::vector<unified::PayloadSidecar*>{},
        *engine, agreement, log);
  }
  std::vector<TokenId> tokens(std::uint32_t i) const {
    std::vector<TokenId> t(static_cast<std::size_t>(kNodePages * kPageTokens) + 1);
    for (std::size_t k = 0; k < t.size(); ++k) t[k] = static_cast<TokenId>(i * 7919 + k);
    return t;
  }
  // A fresh node (its own tokens) holding device slot range `r`; every older device value evicted.
  unified::Node* insert(std::uint32_t i) {
    tree.evict(full, 1 << 20);
    const std::uint32_t r = i % kRanges;
    std::vector<Slot> f, s;
    for (std::int64_t p = 0; p < kNodePages; ++p) f.push_back(Slot(static_cast<std::uint32_t>(r * kNodePages + p + 1)));
    for (std::int64_t p = 0; p < kWindowPages; ++p) s.push_back(Slot(static_cast<std::uint32_t>(r * kWindowPages + p + 1)));
    const auto t = tokens(i);
    const Tokens end(kNodePages * kPageTokens);
    std::vector<InsertValue> v{InsertValue::pages(f), InsertValue::pages(s, end - Tokens(kWindowPages * kPageTokens)),
                               InsertValue::state(Slot(r + 1))};
    return tree.insert(std::span<const TokenId>(t).first(static_cast<std::size_t>(end.value())), v).last_node;
  }
  void backup(unified::Node* n) {
    host->backup_path(n);
    while (host->acks().pending() > 0) host->acks().check();
  }
  static std::int64_t node_bytes(const Bench& b) {
    return static_cast<std::int64_t>(kNodePages * kLayers * b.full_dev.layer_block_bytes() +
                                     kWindowPages * b.swa_dev.layer_block_bytes() + kStateWords * sizeof(std::uint64_t));
  }
};

void BM_HybridBackupNodeThreaded(benchmark::State& state) {
  Bench b;
  for (auto _ : state) {
    state.PauseTiming();
    unified::Node* n = b.insert(b.next++);
    state.ResumeTiming();
    b.backup(n);
  }
  state.SetBytesProcessed(state.iterations() * Bench::node_bytes(b));
}
BENCHMARK(BM_HybridBackupNodeThreaded)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_HybridLoadBackNodeThreaded(benchmark::State& state) {
  Bench b;
  for (auto _ : state) {
    state.PauseTiming();
    const std::uint32_t i = b.next++;
    b.backup(b.insert(i));
    b.tree.evict(b.full, 1 << 20);  // host-only now
    const std::uint32_t r = (i + 1) % kRanges;  // load into another range than the one just written
    const auto t = b.tokens(i);
    state.ResumeTiming();
    auto m = b.tree.match_prefix(t);
    auto items = b.tree.plan_load(m);
    std::vector<transfer::Event> layers, states;
    std::uint32_t used[3] = {0, 0, 0};  // slots handed out per component, from the range's start
    for (const auto& it : items) {
      std::vector<Slot> dev;
      const std::uint32_t c = it.component.value();
      const std::uint32_t base = c == b.full.value() ? r * kNodePages : c == b.swa.value() ? r * kWindowPages : r;
      for (std::size_t k = 0; k < it.host.size(); ++k) dev.push_back(Slot(static_cast<std::uint32_t>(base + used[c]++ + 1)));
      b.host->load(it, dev, layers, states);
      b.tree.commit_load(it, dev);
    }
    for (auto& e : layers) e.synchronize();
    for (auto& e : states) e.synchronize();
  }
  state.SetBytesProcessed(state.iterations() * Bench::node_bytes(b));
}
BENCHMARK(BM_HybridLoadBackNodeThreaded)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The baseline: one thread copying the same blocks (FULL layer by layer, the SWA window, the state).
void BM_HybridNodeMemcpy(benchmark::State& state) {
  Bench b;
  for (auto _ : state) {
    const std::uint32_t r = b.next++ % kRanges, h = (r + 1) % kRanges;
    for (std::size_t l = 0; l < kLayers; ++l)
      for (std::int64_t p = 0; p < kNodePages; ++p)
        std::memcpy(b.full_host.layer_block(PageId(static_cast<std::uint32_t>(h * kNodePages + p + 1)), l),
                    b.full_dev.layer_block(PageId(static_cast<std::uint32_t>(r * kNodePages + p + 1)), l),
                    b.full_dev.layer_block_bytes());
    for (std::int64_t p = 0; p < kWindowPages; ++p)
      std::memcpy(b.swa_host.layer_block(PageId(static_cast<std::uint32_t>(h * kWindowPages + p + 1)), 0),
                  b.swa_dev.layer_block(PageId(static_cast<std::uint32_t>(r * kWindowPages + p + 1)), 0),
                  b.swa_dev.layer_block_bytes());
    auto src = b.state_dev.slot(r + 1);
    std::memcpy(b.state_host.slot(h + 1).data(), src.data(), src.size() * sizeof(std::uint64_t));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * Bench::node_bytes(b));
}
BENCHMARK(BM_HybridNodeMemcpy)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace kvgrid::cache

BENCHMARK_MAIN();
