// Draft-model state in the cache tiers (speculative decoding), in one process: the article's
// example (three cached pages of both models restored into new device slots), the completion
// event of a backup and of a load waiting for the draft's copy (an engine that delays only the
// draft's batches), layout-compatibility errors, and the storage round trip of sidecar draft
// objects with one missing (the hit shrinks to the MIN of target and draft).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <unistd.h>

#include "cache/device_cache.hpp"
#include "cache/draft_state.hpp"
#include "cache/file_storage.hpp"
#include "cache/page_hash.hpp"
#include "core/check.hpp"
#include "protocols/draft_restore.hpp"
#include "runtime/experiment.hpp"
#include "tier_rig.hpp"

namespace kvgrid::cache {
namespace {

using DelayDraftEngine = DelayPoolEngine;

// Target: 2 layers × 2 heads; draft: 1 layer × 2 heads (same block shape: packable).
// The cache layout of a model.draft.mode variant (protocols/draft_restore chooses it).
DraftLayout layout_of(const std::string& mode) { return *protocols::draft_layout(mode); }

TEST(DraftRestore, EveryVariantHasItsLayout) {
  EXPECT_EQ(protocols::draft_modes(), (std::vector<std::string>{"none", "packed", "sidecar", "target_only"}));
  EXPECT_FALSE(protocols::draft_layout("none").has_value());
  EXPECT_EQ(protocols::draft_layout("packed"), DraftLayout::Packed);
  EXPECT_EQ(protocols::draft_layout("sidecar"), DraftLayout::Sidecar);
  EXPECT_EQ(protocols::draft_layout("target_only"), DraftLayout::TargetOnly);
  EXPECT_THROW(protocols::draft_layout("stale"), InternalError);
}

struct DraftRig {
  std::uint64_t clock = 0;
  DecisionLog log;
  Solo agreement;
  KvPool device{{Pages(16), Tokens(kPage), 0, 2, {0, 1}, 1, Payload::Digest}};
  KvPool draft_device{{Pages(16), Tokens(kPage), 100, 1, {0, 1}, 1, Payload::Digest}};
  KvPool host;
  DelayDraftEngine* engine_view = nullptr;
  std::unique_ptr<transfer::TransferEngine> engine;
  DeviceCache dc;
  std::unique_ptr<DraftState> draft;
  std::string dir;

  DraftRig(const std::string& mode, Pages device_pages, std::uint64_t draft_delay_ns = 0, std::string storage_dir = "")
      : host({Pages(32), Tokens(kPage), 0, draft_host_layers(layout_of(mode), 2, 1), {0, 1}, 1, Payload::Digest}),
        dc({Tokens(kPage), device_pages}, log), dir(std::move(storage_dir)) {
    transfer::EngineConfig ec;
    ec.jitter = 0;
    ec.bytes_per_ns = 1.0;
    ec.now = [this] { return clock; };
    ec.advance_to = [this](std::uint64_t t) { clock = std::max(clock, t); };
    auto e = std::make_unique<DelayDraftEngine>(transfer::make_engine(ec), draft_device, draft_delay_ns);
    engine_view = e.get();
    engine = std::move(e);
    HostTierConfig hc;
    hc.host_pages = Pages(32);
    hc.load_back_threshold = Tokens(kPage);
    dc.attach_host_tier(hc, device, host, *engine, agreement);
    if (!dir.empty()) {
      StorageTierConfig sc;
      sc.dir = dir;
      sc.key_suffix = "_draft_test";
      sc.prefetch_threshold = Tokens(2 * kPage);
      sc.stop_policy = "wait_complete";
      sc.jitter = 0;
      sc.latency_ns = 1000;
      sc.bytes_per_ns = 1e9;
      sc.now = [this] { return clock; };
      dc.attach_storage_tier(sc, host, agreement);
    }
    draft = std::make_unique<DraftState>(layout_of(mode), draft_device, &host, 2);
    dc.set_draft(draft.get());
  }

  // Admits `p` (KV for all of it), writes both models' KV (token t: feature 1000 + t + salt) and
  // commits it; the load-back's events are waited for first.
  void run(RequestId id, const std::vector<TokenId>& p, std::uint64_t salt = 0) {
    auto r = dc.reserve(id, p, Tokens(static_cast<std::int64_t>(p.size())));
    ASSERT_TRUE(r.has_value());
    for (auto& e : r->load_events) e.synchronize();
    const auto from = static_cast<std::size_t>(r->matched.value());
    std::vector<std::uint32_t> pages, slots;
    std::vector<std::uint64_t> F;
    for (std::size_t t = from; t < p.size(); ++t) {
      pages.push_back(r->pages[t / kPage].value());
      slots.push_back(static_cast<std::uint32_t>(t % kPage));
      F.push_back(1000 + t + salt);
    }
    std::vector<PageId> fresh(r->pages.end() - r->fresh.value(), r->pages.end());
    device.reset(fresh);
    draft_device.reset(fresh);
    device.write(pages, slots, F);
    draft_device.write(pages, slots, F);
    dc.commit(id, *r, p);
  }
};

std::vector<std::uint64_t> folds(const KvPool& pool, std::span<const PageId> pages) { return pool.page_folds(pages); }

// The cached prefix of `p` (whole pages) as its device pages, after a fresh match.
std::vector<PageId> device_pages_of(DeviceCache& dc, const std::vector<TokenId>& p) {
  return dc.tree().peek_prefix(p).device_pages;
}

TEST(DraftState, PackedAndSidecarRestoreThreeCachedPagesIntoNewSlotsForBothModels) {
  for (const std::string mode : {"packed", "sidecar", "target_only"}) {
    SCOPED_TRACE(mode);
    DraftRig rig(mode, Pages(5));
    const auto a = prompt(13, 1);  // three whole pages reusable
    rig.run(RequestId(1), a);
    const auto before = device_pages_of(rig.dc, a);
    ASSERT_EQ(before.size(), 3u);
    const auto target_folds = folds(rig.device, before), draft_folds = folds(rig.draft_device, before);
    rig.clock = 1'000'000;
    rig.dc.host_tier()->writing_check();  // a's three pages are backed up (both models, one ACK)
    ASSERT_EQ(rig.dc.tree().host_pages(), Pages(3));
    rig.run(RequestId(2), prompt(17, 500));  // 5 pages: evicts a to the host
    rig.clock = 2'000'000;
    rig.dc.host_tier()->writing_check();
    ASSERT_EQ(rig.dc.tree().peek_prefix(a).matched, Tokens(0));
    // The load goes into pages request 2's KV occupied: only a real copy brings back a's.
    auto r = rig.dc.reserve(RequestId(3), a, Tokens(13));
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->host_loaded, Tokens(12));
    for (auto& e : r->load_events) e.synchronize();
    const std::vector<PageId> after(r->pages.begin(), r->pages.begin() + 3);
    EXPECT_EQ(folds(rig.device, after), target_folds);
    if (mode == "target_only") {
      EXPECT_NE(folds(rig.draft_device, after), draft_folds);  // the draft's rows were not restored
      EXPECT_EQ(folds(rig.draft_device, after), std::vector<std::uint64_t>(draft_folds.size(), 0));
      EXPECT_EQ(rig.engine_view->delayed, 0);
    } else {
      EXPECT_EQ(folds(rig.draft_device, after), draft_folds);
      EXPECT_EQ(rig.engine_view->delayed, 3);  // a's backup, request 2's backup, a's load
    }
    rig.dc.commit(RequestId(3), *r, a);
    rig.dc.verify();
  }
}

TEST(DraftState, BackupAckAndLoadWaitForTheDraftCopyAlone) {
  constexpr std::uint64_t kDelay = 500'000;  // only the draft's batches are this late
  for (const std::string mode : {"packed", "sidecar"}) {
    SCOPED_TRACE(mode);
    DraftRig rig(mode, Pages(5), kDelay);
    const auto a = prompt(13, 1);
    rig.run(RequestId(1), a);
    auto* host = rig.dc.host_tier();
    ASSERT_EQ(host->pending_writes(), 1u);
    // The target's copy (3 pages × 2 layers × 2 heads × 8 bytes = 96 ns) is long done; the draft's is not.
    rig.clock = 10'000;
    host->writing_check();
    EXPECT_EQ(host->pending_writes(), 1u) << "the ACK was consumed before the draft's copy finished";
    EXPECT_EQ(rig.dc.tree().host_pages(), Pages(0));
    rig.clock = kDelay + 10'000;
    host->writing_check();
    EXPECT_EQ(host->pending_writes(), 0u);
    EXPECT_EQ(rig.dc.tree().host_pages(), Pages(3));
    const auto draft_folds = folds(rig.draft_device, device_pages_of(rig.dc, a));
    rig.run(RequestId(2), prompt(17, 500));  // evicts a
    rig.clock = 10 * kDelay;
    host->writing_check();
    const std::uint64_t t0 = rig.clock;
    auto r = rig.dc.reserve(RequestId(3), a, Tokens(13));
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->load_events.size(), 2u);  // one per layer; the last one carries the draft's copy
    rig.clock = t0 + 10'000;               // the target's layers are done by now
    EXPECT_TRUE(r->load_events[0].query());
    EXPECT_FALSE(r->load_events[1].query()) << "the load completed before the draft's copy";
    EXPECT_GE(r->load_events[1].complete_ns(), t0 + kDelay);
    r->load_events[1].synchronize();
    EXPECT_EQ(folds(rig.draft_device, std::span<const PageId>(r->pages).first(3)), draft_folds);
    rig.dc.commit(RequestId(3), *r, a);
    rig.dc.verify();
    if (mode == "sidecar") {  // a freed host page's draft bytes are poisoned with the target's
      auto got = host->alloc_host(Pages(1));
      ASSERT_TRUE(got.has_value());
      KvPool& dh = *rig.draft->host();
      std::fill_n(dh.layer_block((*got)[0], 0), dh.layer_block_bytes() / sizeof(std::uint64_t), 7);
      host->free_host(*got);
      EXPECT_NE(*dh.layer_block((*got)[0], 0), 7u);
    }
  }
}

TEST(DraftState, PackedNeedsTheTargetsBlockShape) {
  KvPool draft{{Pages(4), Tokens(kPage), 100, 1, {0, 1, 2}, 1, Payload::Digest}};  // 3 heads
  KvPool host{{Pages(4), Tokens(kPage), 0, 3, {0, 1}, 1, Payload::Digest}};
  try {
    DraftState d(DraftLayout::Packed, draft, &host, 2);
    FAIL() << "an incompatible packed draft was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("sidecar"), std::string::npos) << e.what();
  }
  DraftState sidecar(DraftLayout::Sidecar, draft, &host, 2);  // its own layout: fine
  ASSERT_NE(sidecar.host(), nullptr);
  EXPECT_EQ(sidecar.host()->config().capacity, Pages(4));  // the source pool's slot count
  EXPECT_EQ(sidecar.host()->heads(), 3u);
}

TEST(DraftState, ExperimentChecksTheDraftsLayout) {
  const std::string base = "[topology]\ntp = 2\npp = 2\n[model]\nkv_heads = 4\nhead_dim = 16\n[workload]\nkind = \"multiturn\"\n";
  auto error = [&](const std::string& extra, std::vector<std::string> overrides = {}) -> std::string {
    try {
      parse_experiment(base + extra, "t", overrides);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error("[model.draft]\nmode = \"packed\"\n"), "");
  EXPECT_NE(error("[model.draft]\nmode = \"packed\"\nhead_dim = 8\n").find("model.draft.head_dim = 8 vs model.head_dim = 16"),
            std::string::npos);
  EXPECT_NE(error("[model.draft]\nmode = \"packed\"\ndtype = \"fp8\"\n").find("model.draft.dtype"), std::string::npos);
  EXPECT_EQ(error("[model.draft]\nmode = \"sidecar\"\nhead_dim = 8\ndtype = \"fp8\"\n"), "");
  EXPECT_NE(error("[model.draft]\nmode = \"sidecar\"\nkv_heads = 3\n").find("model.draft.kv_heads = 3 is not divisible"),
            std::string::npos);
  EXPECT_EQ(error("[model.draft]\nmode = \"sidecar\"\n[cache]\ncp_sharding = \"sharded\"\n"), "");  // MHA at CP 1: nothing sharded
  // MLA sharded over TP: the draft's pages follow the target's owners (its own layer gather)
  EXPECT_EQ(error("[model.draft]\nmode = \"sidecar\"\n[cache]\ncp_sharding = \"sharded\"\n", {"model.attention=mla"}), "");
  EXPECT_NE(error("[model.draft]\nmode = \"sidecar\"\n", {"workload.kind=tree"}).find("needs a serving workload"),
            std::string::npos);
}

TEST(DraftState, StorageRoundTripOfSidecarDraftObjectsShrinksToTheMinOnAMissingOne) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("kvgrid-draft-storage-" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  const auto a = prompt(13, 1);
  std::vector<std::uint64_t> target_folds, draft_folds;
  {
    DraftRig writer("sidecar", Pages(8), 0, dir);
    writer.run(RequestId(1), a);
    const auto pages = device_pages_of(writer.dc, a);
    target_folds = folds(writer.device, pages);
    draft_folds = folds(writer.draft_device, pages);
    writer.clock = 1'000'000;
    writer.dc.host_tier()->writing_check();  // published → written through: 3 target and 3 draft objects
    writer.dc.storage_tier()->flush_writes();  // (they would land at the write's tick)
    EXPECT_EQ(writer.dc.storage_tier()->stats().written_pages, 3u);
  }
  const auto chain = page_hash_chain(a, kPage);
  auto object = [&](std::size_t i, bool draft) {
    return FileStorage(dir, 1 << 20).path_of(storage_key(chain[i], "_draft_test") + (draft ? DraftState::kObjectSuffix : ""));
  };
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(std::filesystem::exists(object(i, false)));
    EXPECT_TRUE(std::filesystem::exists(object(i, true)));
  }
  for (const bool missing : {false, true}) {
    SCOPED_TRACE(missing ? "third draft object missing" : "all objects");
    if (missing) {
      ASSERT_TRUE(std::filesystem::remove(object(2, true)));
    }
    DraftRig reader("sidecar", Pages(8), 0, dir);
    reader.dc.on_arrival(RequestId(7), a);
    while (!reader.dc.prefetch_ready(RequestId(7))) reader.clock = reader.dc.storage_tier()->next_ack_ns();
    const Tokens want(missing ? 8 : 12);  // the MIN of the target's hit (3 pages) and the draft's
    EXPECT_EQ(reader.dc.tree().peek_prefix(a).host_matched, want);
    auto r = reader.dc.reserve(RequestId(7), a, Tokens(13));
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->storage_loaded, want);
    for (auto& e : r->load_events) e.synchronize();
    const std::size_t n = static_cast<std::size_t>(want.value() / kPage);
    const std::span<const PageId> got(r->pages.data(), n);
    EXPECT_EQ(folds(reader.device, got), std::vector<std::uint64_t>(target_folds.begin(), target_folds.begin() + 4 * n));
    EXPECT_EQ(folds(reader.draft_device, got), std::vector<std::uint64_t>(draft_folds.begin(), draft_folds.begin() + 2 * n));
    reader.dc.commit(RequestId(7), *r, a);
    reader.dc.verify();
  }
  std::filesystem::remove_all(dir);
}

// A hybrid draft's recurrent states: packed after the target's words in the host slot, sidecar in
// a host pool of its own at the target's slot, target_only nowhere (a restored slot is poisoned).
TEST(DraftStates, EachLayoutKeepsTheDraftsWordsWhereItSays) {
  for (DraftLayout layout : {DraftLayout::Packed, DraftLayout::Sidecar, DraftLayout::TargetOnly}) {
    SCOPED_TRACE(static_cast<int>(layout));
    StatePool dev(4, 2), host(4, layout == DraftLayout::Packed ? 5 : 3);  // draft: 2 words; target: 3
    DraftStates d(layout, dev, &host, 3);
    dev.slot(2)[0] = 11;
    dev.slot(2)[1] = 12;
    auto run = [](const std::optional<transfer::Copy>& c) {
      if (c) std::memcpy(c->dst, c->src, c->bytes);
      return c.has_value();
    };
    EXPECT_EQ(run(d.backup_copy(3, 2)), layout != DraftLayout::TargetOnly);
    if (layout == DraftLayout::Packed) {
      EXPECT_EQ(host.slot(3)[3], 11u);
      EXPECT_EQ(host.slot(3)[4], 12u);
      EXPECT_EQ(host.slot(3)[0], StatePool::kPoison) << "the target's words are left alone";
    }
    EXPECT_EQ(run(d.restore_copy(4, 3)), layout != DraftLayout::TargetOnly);
    const std::vector<std::uint64_t> back(dev.slot(4).begin(), dev.slot(4).end());
    if (layout == DraftLayout::TargetOnly) EXPECT_EQ(back, (std::vector<std::uint64_t>{StatePool::kPoison, StatePool::kPoison}));
    else EXPECT_EQ(back, (std::vector<std::uint64_t>{11, 12}));
  }
}

// A hybrid draft's kind on a last stage without a target layer of it: no target host pool, but
// host slots of the kind — packed and sidecar keep the draft's copies in a pool of their own with
// that many slots (at the target's host ids); target_only keeps none.
TEST(DraftState, AKindWithoutTargetBytesKeepsTheDraftsHostCopiesInAPoolOfItsOwn) {
  for (DraftLayout layout : {DraftLayout::Packed, DraftLayout::Sidecar, DraftLayout::TargetOnly}) {
    SCOPED_TRACE(static_cast<int>(layout));
    KvPool dev(KvPoolConfig{Pages(4), Tokens(4), 0, 1, {0, 1}, 2, Payload::Full});
    DraftState d(layout, dev, nullptr, 0, /*own_slots=*/6);
    if (layout == DraftLayout::TargetOnly) {
      EXPECT_EQ(d.host(), nullptr);
      EXPECT_FALSE(d.separate_objects());
      continue;
    }
    ASSERT_NE(d.host(), nullptr);
    EXPECT_EQ(d.host()->config().capacity, Pages(6));
    EXPECT_EQ(d.host_layer0(), 0u);
    EXPECT_TRUE(d.separate_objects()) << "in storage: the kind's object on this rank";
    auto* w = reinterpret_cast<std::uint64_t*>(dev.layer_block(PageId(2), 0));
    w[0] = 41;
    w[1] = 42;
    const PageId host_page[1] = {PageId(5)}, src[1] = {PageId(2)}, dst[1] = {PageId(3)};
    for (const auto& c : d.backup_copies(host_page, src)) std::memcpy(c.dst, c.src, c.bytes);
    for (const auto& c : d.restore_copies(dst, host_page)) std::memcpy(c.dst, c.src, c.bytes);
    const auto* back = reinterpret_cast<const std::uint64_t*>(dev.layer_block(PageId(3), 0));
    EXPECT_EQ(back[0], 41u);
    EXPECT_EQ(back[1], 42u);
  }
  for (DraftLayout layout : {DraftLayout::Packed, DraftLayout::Sidecar, DraftLayout::TargetOnly}) {
    StatePool dev(4, 2);
    DraftStates d(layout, dev, nullptr, 0, /*own_slots=*/6);
    EXPECT_EQ(d.sidecar() != nullptr, layout != DraftLayout::TargetOnly);
    EXPECT_EQ(d.packed_words(), 0u) << "no target slot to pack into";
    if (!d.sidecar()) continue;
    EXPECT_EQ(d.sidecar()->capacity(), 6u);
    dev.slot(1)[0] = 7;
    dev.slot(1)[1] = 8;
    auto run = [](const std::optional<transfer::Copy>& c) {
      ASSERT_TRUE(c.has_value());
      std::memcpy(c->dst, c->src, c->bytes);
    };
    run(d.backup_copy(5, 1));
    run(d.restore_copy(3, 5));
    EXPECT_EQ(std::vector<std::uint64_t>(dev.slot(3).begin(), dev.slot(3).end()), (std::vector<std::uint64_t>{7, 8}));
  }
}

}  // namespace
}  // namespace kvgrid::cache
