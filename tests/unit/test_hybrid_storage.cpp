// The storage tier of hybrid models (hybrid_storage_site.hpp) in one process, on the simulated
// engine with a test-driven clock: a history of FULL pages, SWA window pages and MAMBA states is
// backed up to the host and written as objects per component; a fresh stack over the same
// directory (another job) prefetches it back as host copies whose bytes equal the originals.
// A missing component object shrinks the hit to the deepest boundary every component can still
// serve; a damaged one fails the whole prefetch (all or nothing) and leaves nothing behind; the
// damage failpoints hit each kind of object an item reads.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "cache/hybrid_host_tier.hpp"
#include "cache/hybrid_storage_site.hpp"
#include "cache/page_hash.hpp"
#include "cache/storage_tier.hpp"
#include "tier_rig.hpp"

namespace kvgrid::cache {
namespace {

using unified::ComponentId;
using unified::InsertValue;
using unified::Slot;

constexpr std::int64_t kWindow = 8, kChunk = 8;  // SWA: 2 pages; MAMBA states every 2 pages

std::vector<std::uint64_t> block(const KvPool& pool, std::uint32_t page, std::size_t layer) {
  const std::uint64_t* b = pool.layer_block(PageId(page), layer);
  return std::vector<std::uint64_t>(b, b + pool.layer_block_bytes() / sizeof(std::uint64_t));
}

void fill(KvPool& pool, std::uint32_t page, std::uint64_t seed) {
  for (std::size_t l = 0; l < pool.layers(); ++l) {
    std::uint64_t* b = pool.layer_block(PageId(page), l);
    for (std::size_t i = 0; i < pool.layer_block_bytes() / sizeof(std::uint64_t); ++i) b[i] = seed * 1000 + l * 100 + i;
  }
}

// One rank's tree (FULL, SWA, MAMBA), device and host pools, host tier and storage tier over `dir`.
struct Stack {
  std::uint64_t clock = 0;
  DecisionLog log;
  Solo agreement;
  KvPool full_dev{{Pages(32), Tokens(kPage), 0, 2, {0, 1}, 1, Payload::Full}};
  KvPool full_host{{Pages(32), Tokens(kPage), 0, 2, {0, 1}, 1, Payload::Full}};
  KvPool swa_dev{{Pages(32), Tokens(kPage), 100, 1, {0, 1}, 1, Payload::Full}};
  KvPool swa_host{{Pages(32), Tokens(kPage), 100, 1, {0, 1}, 1, Payload::Full}};
  StatePool st_dev{16, 3}, st_host{16, 3};
  std::unique_ptr<transfer::TransferEngine> engine;
  unified::UnifiedTree tree{Tokens(kPage)};
  ComponentId full, swa, mamba;
  std::unique_ptr<HybridHostTier> host;
  std::unique_ptr<StorageTier> storage;

  explicit Stack(const std::string& dir, decltype(StorageFaults::page_fault) page_fault = {}) {
    transfer::EngineConfig ec;
    ec.jitter = 0;
    ec.bytes_per_ns = 1.0;
    ec.now = [this] { return clock; };
    ec.advance_to = [this](std::uint64_t t) { clock = std::max(clock, t); };
    engine = transfer::make_engine(ec);
    full = tree.add_component(std::make_unique<unified::FullComponent>());
    swa = tree.add_component(std::make_unique<unified::SwaComponent>(Tokens(kWindow)));
    mamba = tree.add_component(std::make_unique<unified::MambaComponent>(Tokens(kChunk)));
    HybridHostConfig hc;
    hc.tier.host_pages = Pages(32);
    hc.tier.load_back_threshold = Tokens(kPage);
    hc.swa_pages = 32;
    hc.mamba_slots = 16;
    hc.local_layers = 4;
    host = std::make_unique<HybridHostTier>(
        hc, tree, std::vector<ComponentKind>{ComponentKind::Full, ComponentKind::Swa, ComponentKind::Mamba},
        HybridBytes{&full_dev, &full_host, &swa_dev, &swa_host, &st_dev, &st_host}, std::vector<unified::PayloadSidecar*>{},
        *engine, agreement, log);
    StorageTierConfig sc;
    sc.dir = dir;
    sc.key_suffix = "_test";
    sc.prefetch_threshold = Tokens(kPage);
    sc.stop_policy = "wait_complete";
    sc.faults.page_fault = std::move(page_fault);
    sc.batch_pages = 2;
    sc.jitter = 0;
    sc.latency_ns = 1000;
    sc.bytes_per_ns = 1e9;
    sc.now = [this] { return clock; };
    sc.advance_to = [this](std::uint64_t t) { clock = std::max(clock, t); };
    storage = std::make_unique<StorageTier>(sc, agreement, log, [&](const StorageContext& ctx) {
      return std::make_unique<HybridStorageSite>(ctx, tree, *host, Tokens(kWindow), Tokens(kChunk));
    });
  }

  void verify() const {
    unified::VerifyAccounts acc;
    host->host_accounts(acc);
    tree.verify(&acc);
  }
  // Starts a prefetch of `prompt`, lets every batch land, ends it: the pages it added.
  std::size_t prefetch(std::span<const TokenId> prompt) {
    storage->start_prefetch(RequestId(1), prompt);
    clock += 1'000'000;
    EXPECT_TRUE(storage->try_finish(RequestId(1)));
    const auto [b, e] = storage->prefetched_range(RequestId(1));
    return static_cast<std::size_t>((e - b).value() / kPage);
  }
  // Host copy of component c on each page of tokens[0, n) (0: none), from the walk.
  std::vector<std::uint32_t> host_pages(std::span<const TokenId> t, ComponentId c) {
    std::vector<std::uint32_t> out;
    auto m = tree.peek_prefix(t);
    for (const auto& cand : m.candidates) {
      const auto& d = cand.node->at(c);
      const std::size_t k = cand.node->key.size() / kPage;
      for (std::size_t i = 0; i < k; ++i) out.push_back(d.host && d.host->size() == k ? (*d.host)[i].value() : 0);
    }
    return out;
  }
};

struct Dir {
  std::string path;
  explicit Dir(const std::string& tag)
      : path((std::filesystem::temp_directory_path() / ("kvgrid-hybrid-storage-" + tag + "-" + std::to_string(::getpid()))).string()) {
    std::filesystem::remove_all(path);
  }
  ~Dir() { std::filesystem::remove_all(path); }
  std::string object(std::span<const TokenId> t, std::size_t page, const char* suffix) const {
    const auto chain = page_hash_chain(t.first((page + 1) * kPage), kPage);
    return (std::filesystem::path(path) / (storage_key(chain[page], "_test") + suffix + ".bin")).string();
  }
};

// The original bytes of the history (device pages 1..6 FULL, SWA pages 1..4 = positions 2..5,
// states 1 (depth 16) and 2 (depth 24)).
struct History {
  std::vector<std::vector<std::uint64_t>> full, swa, states;
};

// Writes [0, 24) as two inserts — [0, 16) with its SWA window [8, 16) and the state at 16, then
// [16, 24) with the window [16, 24) and the state at 24 — backs it all up, lets the backups
// publish (and the objects be written).
History write_history(const std::string& dir, std::span<const TokenId> t) {
  Stack s(dir);
  History h;
  for (std::uint32_t p = 1; p <= 6; ++p) {
    fill(s.full_dev, p, p);
    h.full.push_back(block(s.full_dev, p, 1));
  }
  for (std::uint32_t p = 1; p <= 4; ++p) {
    fill(s.swa_dev, p, 50 + p);
    h.swa.push_back(block(s.swa_dev, p, 0));
  }
  for (std::uint32_t st = 1; st <= 2; ++st) {
    auto w = s.st_dev.slot(st);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = 7000 + st * 10 + i;
    h.states.emplace_back(w.begin(), w.end());
  }
  std::vector<InsertValue> a{InsertValue::pages({Slot(1), Slot(2), Slot(3), Slot(4)}),
                             InsertValue::pages({Slot(1), Slot(2)}, Tokens(8)), InsertValue::state(Slot(1))};
  unified::Node* n16 = s.tree.insert(t.first(16), a).last_node;
  std::vector<InsertValue> b{InsertValue::pages({Slot(5), Slot(6)}, Tokens(16)),
                             InsertValue::pages({Slot(3), Slot(4)}, Tokens(16)), InsertValue::state(Slot(2))};
  unified::Node* n24 = s.tree.insert_below(n16, t.first(24), b).last_node;
  s.host->backup_path(n24);
  s.clock += 1'000'000;
  s.host->acks().check();
  EXPECT_EQ(s.host->acks().pending(), 0u);
  EXPECT_EQ(s.storage->stats().written_pages, 0u) << "the objects are in flight (storage_writer.hpp)";
  s.clock += 1'000'000;  // past the write queue's tail (a batch per published node, 1,000 ns each)
  s.storage->settle_writes();
  EXPECT_EQ(s.storage->stats().written_pages, 6u) << "one FULL object per page";
  s.verify();
  return h;
}

TEST(HybridStorage, AnotherJobPrefetchesEveryComponentBackAsHostCopiesWithTheirBytes) {
  Dir dir("roundtrip");
  const auto t = prompt(25);
  const std::span<const TokenId> ts(t);
  const History h = write_history(dir.path, ts);
  // Objects per component: FULL every page, SWA only where the host had window pages (2..5),
  // MAMBA at the two checkpoint depths.
  for (std::size_t page = 0; page < 6; ++page) {
    EXPECT_TRUE(std::filesystem::exists(dir.object(ts, page, ""))) << "FULL page " << page;
    EXPECT_EQ(std::filesystem::exists(dir.object(ts, page, ".swa")), page >= 2) << "SWA page " << page;
    EXPECT_EQ(std::filesystem::exists(dir.object(ts, page, ".mamba")), page == 3 || page == 5) << "state after page " << page;
  }

  Stack s(dir.path);  // a fresh stack: nothing in its tree
  EXPECT_EQ(s.prefetch(ts), 6u) << "the boundary at 24: FULL, the window [16, 24) and the state at 24";
  s.verify();
  auto m = s.tree.peek_prefix(ts);
  EXPECT_EQ(m.matched, Tokens(0));
  EXPECT_EQ(m.host_matched, Tokens(24)) << "every component accepts 24 with host copies";
  const auto fh = s.host_pages(ts, s.full), sh = s.host_pages(ts, s.swa);
  ASSERT_EQ(fh.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(block(s.full_host, fh[i], 1), h.full[i]) << "FULL page " << i;
  EXPECT_EQ(sh[0] + sh[1] + sh[2] + sh[3], 0u) << "no SWA host copy before the window (host tombstones)";
  EXPECT_EQ(block(s.swa_host, sh[4], 0), h.swa[2]);
  EXPECT_EQ(block(s.swa_host, sh[5], 0), h.swa[3]);
  const auto* last = m.host_node;
  ASSERT_TRUE(last->at(s.mamba).backed());
  auto w = s.st_host.slot((*last->at(s.mamba).host)[0].value());
  EXPECT_EQ(std::vector<std::uint64_t>(w.begin(), w.end()), h.states[1]);
  EXPECT_EQ(s.tree.host_slots(s.swa), 2) << "only the window's two SWA pages were read";
  EXPECT_EQ(s.tree.host_slots(s.mamba), 1) << "and only the boundary's state";

  // A second prefetch finds everything on the host: nothing to read.
  s.storage->forget(RequestId(1));
  EXPECT_EQ(s.prefetch(ts), 0u);
}

TEST(HybridStorage, AMissingComponentObjectShrinksTheHitToWhatEveryComponentCanServe) {
  const auto t = prompt(25);
  const std::span<const TokenId> ts(t);
  struct Case {
    const char* what;
    std::size_t page;
    const char* suffix;
    std::size_t hit;
  };
  for (const Case& c : {Case{"the state at 24", 5, ".mamba", 4}, Case{"an SWA page of the window before 24", 4, ".swa", 4},
                        Case{"an SWA page only the window before 16 needs", 2, ".swa", 6},
                        Case{"a FULL page above 16", 3, "", 0}, Case{"a FULL page below 16", 4, "", 4}}) {
    SCOPED_TRACE(c.what);
    Dir dir(std::string("missing-") + std::to_string(c.page) + c.suffix);
    write_history(dir.path, ts);
    ASSERT_TRUE(std::filesystem::remove(dir.object(ts, c.page, c.suffix)));
    Stack s(dir.path);
    EXPECT_EQ(s.prefetch(ts), c.hit);
    EXPECT_EQ(s.tree.peek_prefix(ts).host_matched, Tokens(static_cast<std::int64_t>(c.hit) * kPage));
    s.verify();
  }
}

TEST(HybridStorage, ADamagedComponentObjectFailsThePrefetchAllOrNothing) {
  const auto t = prompt(25);
  const std::span<const TokenId> ts(t);
  for (const char* suffix : {".swa", ".mamba", ""}) {
    SCOPED_TRACE(std::string("damaged object '") + suffix + "'");
    Dir dir(std::string("damaged") + suffix);
    write_history(dir.path, ts);
    const std::string path = dir.object(ts, 5, suffix);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x5a');
    f.close();
    Stack s(dir.path);
    EXPECT_EQ(s.prefetch(ts), 0u) << "SWA's window and MAMBA's state sit at the end: a shorter prefix is no boundary";
    EXPECT_EQ(s.tree.node_count(), 0u) << "nothing was inserted";
    EXPECT_EQ(s.host->pool(s.full).free_count(), 32);
    EXPECT_EQ(s.host->pool(s.swa).free_count(), 32);
    EXPECT_EQ(s.host->pool(s.mamba).free_count(), 16);
    EXPECT_EQ(s.storage->stats().failed_pages, 1u);
    s.verify();
  }
}

TEST(HybridStorage, DamageFailpointsHitEveryKindOfObjectAnItemReadsInTurn) {
  // storage.read.short on the last item (page 5: its FULL page, its SWA window page and the state
  // at 24) in three prefetches by one tier: the FULL object, then the SWA one, then MAMBA's.
  const auto t = prompt(25);
  const std::span<const TokenId> ts(t);
  Dir dir("damage-turns");
  write_history(dir.path, ts);
  const char* suffixes[] = {"", ".swa", ".mamba"};
  std::vector<std::uintmax_t> size;
  for (const char* sfx : suffixes) size.push_back(std::filesystem::file_size(dir.object(ts, 5, sfx)));
  std::size_t batch = 0;  // batches of 2 items: the third one of each prefetch holds item 5
  Stack s(dir.path, [&batch](const char* failpoint, std::size_t) -> std::optional<std::size_t> {
    if (std::string(failpoint) != "storage.read.short") return std::nullopt;
    return ++batch % 3 == 0 ? std::optional<std::size_t>(1) : std::nullopt;
  });
  for (std::size_t round = 0; round < 3; ++round) {
    SCOPED_TRACE("prefetch " + std::to_string(round));
    EXPECT_EQ(s.prefetch(ts), 0u) << "a short object fails the prefetch whole";
    s.storage->forget(RequestId(1));
    for (std::size_t k = 0; k < 3; ++k)
      EXPECT_EQ(std::filesystem::file_size(dir.object(ts, 5, suffixes[k])) < size[k], k <= round)
          << "object '" << suffixes[k] << "' damaged by now";
    s.verify();
  }
}

}  // namespace
}  // namespace kvgrid::cache
