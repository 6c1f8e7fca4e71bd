// The host tier of hybrid models (hybrid_host_tier.hpp) in one process, on the simulated engine
// with a test-driven clock: a node's backup ACK waits for its slowest component copy (an engine
// that delays only the SWA pool's batches: nobody sees the host copy early, and the FULL copy
// alone does not publish it), the host copies hold the device's bytes, and a load-back restores
// FULL per layer and the SWA window as a separate event that lands only when its delayed copy
// does; a draft model's pages move with the target's (packed, sidecar, target_only).
#include <gtest/gtest.h>

#include <cstring>

#include "cache/hybrid_host_tier.hpp"
#include "tier_rig.hpp"

namespace kvgrid::cache {
namespace {

using unified::ComponentId;
using unified::InsertValue;
using unified::Slot;

constexpr std::uint64_t kDelay = 500'000;

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

struct HostRig {
  std::uint64_t clock = 0;
  DecisionLog log;
  Solo agreement;
  KvPool full_dev{{Pages(16), Tokens(kPage), 0, 2, {0, 1}, 1, Payload::Digest}};
  KvPool full_host{{Pages(16), Tokens(kPage), 0, 2, {0, 1}, 1, Payload::Digest}};
  KvPool swa_dev{{Pages(16), Tokens(kPage), 100, 1, {0, 1}, 1, Payload::Full}};
  KvPool swa_host{{Pages(16), Tokens(kPage), 100, 1, {0, 1}, 1, Payload::Full}};
  std::unique_ptr<DelayPoolEngine> engine;
  unified::UnifiedTree tree{Tokens(kPage)};
  ComponentId full, swa;
  std::unique_ptr<HybridHostTier> host;

  explicit HostRig(std::string policy = "write_through") {
    transfer::EngineConfig ec;
    ec.jitter = 0;
    ec.bytes_per_ns = 1.0;
    ec.now = [this] { return clock; };
    ec.advance_to = [this](std::uint64_t t) { clock = std::max(clock, t); };
    engine = std::make_unique<DelayPoolEngine>(transfer::make_engine(ec), swa_dev, kDelay);
    full = tree.add_component(std::make_unique<unified::FullComponent>());
    swa = tree.add_component(std::make_unique<unified::SwaComponent>(Tokens(8)));
    HybridHostConfig hc;
    hc.tier.host_pages = Pages(16);
    hc.tier.write_policy = std::move(policy);
    hc.tier.write_through_threshold = 2;
    hc.tier.load_back_threshold = Tokens(kPage);
    hc.swa_pages = 16;
    hc.local_layers = 3;  // two FULL layers and one SWA layer on this "stage"
    host = std::make_unique<HybridHostTier>(hc, tree, std::vector<ComponentKind>{ComponentKind::Full, ComponentKind::Swa},
                                            HybridBytes{&full_dev, &full_host, &swa_dev, &swa_host, nullptr, nullptr},
                                            std::vector<unified::PayloadSidecar*>{}, *engine, agreement, log);
  }
};

TEST(HybridHostTier, ABackupAckWaitsForItsSlowestComponentAndALoadBackForItsWindow) {
  HostRig rig;
  std::vector<TokenId> t(12);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<TokenId>(7 + i);
  for (std::uint32_t p : {1u, 2u}) {
    fill(rig.full_dev, p, p);
    fill(rig.swa_dev, p, 50 + p);
  }
  std::vector<InsertValue> v{InsertValue::pages({Slot(1), Slot(2)}), InsertValue::pages({Slot(1), Slot(2)})};
  unified::Node* n = rig.tree.insert(std::span<const TokenId>(t).first(8), v).last_node;
  rig.host->backup_path(n);
  ASSERT_EQ(rig.host->acks().pending(), 1u) << "one ACK for the node's FULL and SWA copies";
  EXPECT_EQ(rig.engine->delayed, 1) << "the SWA copy alone is delayed";
  // FULL's copy (2 pages × 2 layers × 2 heads × 8 bytes = 64 ns) is long done; SWA's is not.
  rig.clock = 10'000;
  rig.host->acks().check();
  EXPECT_EQ(rig.host->acks().pending(), 1u) << "the ACK was consumed before the SWA copy landed";
  EXPECT_FALSE(n->at(rig.full).backed() || n->at(rig.swa).backed()) << "nothing is published before every copy landed";
  EXPECT_NE(block(rig.swa_host, 1, 0), block(rig.swa_dev, 1, 0)) << "the delayed copy has not happened";
  rig.clock = kDelay + 10'000;
  rig.host->acks().check();
  EXPECT_EQ(rig.host->acks().pending(), 0u);
  ASSERT_TRUE(n->at(rig.full).backed() && n->at(rig.swa).backed());
  const auto fh = *n->at(rig.full).host, sh = *n->at(rig.swa).host;
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(block(rig.full_host, fh[i].value(), 1), block(rig.full_dev, i + 1, 1));
    EXPECT_EQ(block(rig.swa_host, sh[i].value(), 0), block(rig.swa_dev, i + 1, 0));
  }
  const auto swa_bytes = block(rig.swa_dev, 2, 0);
  unified::VerifyAccounts acc;
  rig.host->host_accounts(acc);
  rig.tree.verify(&acc);

  // Demote the node (its device pages poisoned) and load it back into new device slots 5 and 6.
  auto e = rig.tree.evict(rig.full, 10);
  ASSERT_EQ(e.freed[rig.full.value()].size(), 2u);
  rig.full_dev.poison(std::vector<PageId>{PageId(1), PageId(2)});
  rig.swa_dev.poison(std::vector<PageId>{PageId(1), PageId(2)}, /*always=*/true);
  auto m = rig.tree.match_prefix(std::span<const TokenId>(t).first(9));
  ASSERT_EQ(m.matched, Tokens(0));
  ASSERT_EQ(m.host_matched, Tokens(8));
  auto items = rig.tree.plan_load(m);
  ASSERT_EQ(items.size(), 2u);
  std::vector<transfer::Event> layers, states;
  const std::uint64_t t0 = rig.clock;
  for (const auto& it : items) {
    std::vector<Slot> dev{Slot(5), Slot(6)};
    rig.host->load(it, dev, layers, states);
    rig.tree.commit_load(it, dev);
  }
  ASSERT_EQ(layers.size(), 3u) << "one event per local layer: FULL's two layers, then one that is complete at once";
  ASSERT_EQ(states.size(), 1u) << "the SWA window's copy";
  rig.clock = t0 + 10'000;
  EXPECT_TRUE(layers[0].query() && layers[1].query() && layers[2].query());
  EXPECT_FALSE(states[0].query()) << "the SWA window landed before its delayed copy";
  EXPECT_NE(block(rig.swa_dev, 6, 0), swa_bytes);
  states[0].synchronize();
  EXPECT_EQ(block(rig.swa_dev, 6, 0), swa_bytes);
  EXPECT_EQ(block(rig.full_dev, 6, 1), block(rig.full_host, fh[1].value(), 1));
  EXPECT_EQ(rig.tree.match_prefix(std::span<const TokenId>(t).first(9)).matched, Tokens(8));
}

// Speculative decoding with the hybrid host tier: the draft's FULL layer (at the target's page ids)
// backs up with the target's pages — packed after the target's layers in the host page, or in a
// sidecar pool — as one more batch of the node's joined event: with only the draft's copies
// delayed, the ACK waits for them; a load-back's last FULL layer waits for the draft's restore and
// brings its bytes back; target_only moves nothing and clears the restored draft rows.
TEST(HybridHostTier, TheDraftMovesWithTheTargetAndItsAckWaitsForIt) {
  for (DraftLayout layout : {DraftLayout::Packed, DraftLayout::Sidecar, DraftLayout::TargetOnly}) {
    SCOPED_TRACE(static_cast<int>(layout));
    std::uint64_t clock = 0;
    DecisionLog log;
    Solo agreement;
    KvPool full_dev{{Pages(16), Tokens(kPage), 0, 2, {0, 1}, 1, Payload::Digest}};
    KvPool full_host{{Pages(16), Tokens(kPage), 0, layout == DraftLayout::Packed ? 3u : 2u, {0, 1}, 1, Payload::Digest}};
    KvPool draft_dev{{Pages(16), Tokens(kPage), 1u << 20, 1, {0, 1}, 1, Payload::Digest}};
    transfer::EngineConfig ec;
    ec.jitter = 0;
    ec.bytes_per_ns = 1.0;
    ec.now = [&clock] { return clock; };
    ec.advance_to = [&clock](std::uint64_t t) { clock = std::max(clock, t); };
    DelayPoolEngine engine(transfer::make_engine(ec), draft_dev, kDelay);
    unified::UnifiedTree tree{Tokens(kPage)};
    const ComponentId full = tree.add_component(std::make_unique<unified::FullComponent>());
    HybridHostConfig hc;
    hc.tier.host_pages = Pages(16);
    hc.tier.load_back_threshold = Tokens(kPage);
    hc.local_layers = 2;
    HybridHostTier host(hc, tree, {ComponentKind::Full}, HybridBytes{&full_dev, &full_host, nullptr, nullptr, nullptr, nullptr},
                        {}, engine, agreement, log);
    DraftState draft(layout, draft_dev, &full_host, 2);
    host.set_draft({&draft, nullptr, nullptr});
    std::vector<TokenId> t(12);
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<TokenId>(7 + i);
    for (std::uint32_t p : {1u, 2u}) {
      fill(full_dev, p, p);
      fill(draft_dev, p, 90 + p);
    }
    const auto draft_bytes = block(draft_dev, 2, 0);
    const std::vector<InsertValue> v{InsertValue::pages({Slot(1), Slot(2)})};
    unified::Node* n = tree.insert(std::span<const TokenId>(t).first(8), v).last_node;
    host.backup_path(n);
    const bool moves = layout != DraftLayout::TargetOnly;
    EXPECT_EQ(engine.delayed, moves ? 1 : 0) << "the draft's copies are a batch of their own";
    clock = 10'000;
    host.acks().check();
    EXPECT_EQ(n->at(full).backed(), !moves) << "published before the draft's copy landed";
    clock = kDelay + 10'000;
    host.acks().check();
    ASSERT_TRUE(n->at(full).backed());
    const auto fh = *n->at(full).host;
    if (layout == DraftLayout::Packed) {
      EXPECT_EQ(block(full_host, fh[1].value(), 2), draft_bytes) << "after the target's layers";
    }
    if (layout == DraftLayout::Sidecar) {
      EXPECT_EQ(block(*draft.host(), fh[1].value(), 0), draft_bytes) << "at the target's host page";
    }
    // Demote, poison the device pages (target and draft), load back into slots 5 and 6.
    ASSERT_EQ(tree.evict(full, 10).freed[full.value()].size(), 2u);
    full_dev.poison(std::vector<PageId>{PageId(1), PageId(2)});
    draft_dev.poison(std::vector<PageId>{PageId(1), PageId(2)});
    auto m = tree.match_prefix(std::span<const TokenId>(t).first(9));
    ASSERT_EQ(m.host_matched, Tokens(8));
    auto items = tree.plan_load(m);
    ASSERT_EQ(items.size(), 1u);
    std::vector<transfer::Event> layers, states;
    const std::uint64_t t0 = clock;
    const std::vector<Slot> dev{Slot(5), Slot(6)};
    host.load(items[0], dev, layers, states);
    tree.commit_load(items[0], dev);
    ASSERT_EQ(layers.size(), 2u);
    EXPECT_TRUE(states.empty());
    clock = t0 + 10'000;
    EXPECT_TRUE(layers[0].query());
    EXPECT_EQ(layers[1].query(), !moves) << "the last layer waits for the draft's restore";
    layers[1].synchronize();
    EXPECT_EQ(block(full_dev, 6, 1), block(full_host, fh[1].value(), 1));
    if (moves) {
      EXPECT_EQ(block(draft_dev, 6, 0), draft_bytes);
    } else {
      EXPECT_NE(block(draft_dev, 6, 0), draft_bytes) << "target_only: the draft gets nothing back";
    }
    if (layout == DraftLayout::Sidecar) {  // a freed host slot's draft bytes are poisoned with the target's
      auto got = host.alloc_host(full, 1);
      ASSERT_TRUE(got.has_value());
      const std::uint32_t h = (*got)[0].value();
      fill(*draft.host(), h, 7);
      const auto before = block(*draft.host(), h, 0);
      host.free_host(full, *got);
      EXPECT_NE(block(*draft.host(), h, 0), before);
    }
  }
}

TEST(HybridHostTier, WriteThroughSelectiveBacksUpANodeOnceItsHitsReachTheThreshold) {
  HostRig rig("write_through_selective");
  std::vector<TokenId> t(12);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<TokenId>(3 + i);
  std::vector<InsertValue> v{InsertValue::pages({Slot(1), Slot(2)}), InsertValue::pages({Slot(1), Slot(2)})};
  unified::Node* n = rig.tree.insert(std::span<const TokenId>(t).first(8), v).last_node;
  rig.host->backup_path(n);
  EXPECT_EQ(rig.host->acks().pending(), 0u) << "no hit yet";
  for (std::uint64_t hits = 1; hits <= 2; ++hits) {
    auto m = rig.tree.match_prefix(std::span<const TokenId>(t).first(9));
    ASSERT_EQ(m.last_node, n);
    EXPECT_EQ(n->hit_count, hits);
    rig.host->on_hit(m.last_node);
    EXPECT_EQ(rig.host->acks().pending(), hits == 2 ? 1u : 0u) << hits << " hits, threshold 2";
  }
  rig.tree.peek_prefix(std::span<const TokenId>(t).first(9));
  EXPECT_EQ(n->hit_count, 2u) << "a peek is not a hit";
}

// write_back: nothing is backed up on insert; a device eviction victim is backed up first —
// synchronously, with its unbacked ancestor (host copies form a prefix) — and stays as a
// host-only node whose host copies hold the device's bytes; a failed host allocation drops it.
TEST(HybridHostTier, WriteBackBacksUpAnEvictionVictimAndItsAncestorsBeforeTheyGo) {
  HostRig rig("write_back");
  std::vector<TokenId> t(20);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<TokenId>(11 + i);
  for (std::uint32_t p = 1; p <= 4; ++p) {
    fill(rig.full_dev, p, p);
    fill(rig.swa_dev, p, 60 + p);
  }
  std::vector<InsertValue> a{InsertValue::pages({Slot(1), Slot(2)}), InsertValue::pages({Slot(1), Slot(2)})};
  unified::Node* up = rig.tree.insert(std::span<const TokenId>(t).first(8), a).last_node;
  std::vector<InsertValue> b{InsertValue::pages({Slot(3), Slot(4)}, Tokens(8)), InsertValue::pages({Slot(3), Slot(4)}, Tokens(8))};
  unified::Node* low = rig.tree.insert_below(up, std::span<const TokenId>(t).first(16), b).last_node;
  rig.host->backup_path(low);
  EXPECT_EQ(rig.host->acks().pending(), 0u) << "write_back backs nothing up on insert";
  auto hook = [&](unified::Node* v) { rig.host->write_back(v); };
  auto e = rig.tree.evict(rig.full, 2, hook);  // the leaf `low` goes first (LRU: a leaf)
  EXPECT_EQ(e.freed[rig.full.value()], (std::vector<Slot>{Slot(3), Slot(4)}));
  EXPECT_EQ(e.nodes_deleted, 0u) << "the victim stays, host-only";
  ASSERT_TRUE(up->at(rig.full).backed() && low->at(rig.full).backed() && low->at(rig.swa).backed())
      << "the victim and its unbacked ancestor were backed up";
  EXPECT_FALSE(low->at(rig.full).live());
  EXPECT_TRUE(up->at(rig.full).live()) << "the ancestor was only backed up";
  const auto lh = *low->at(rig.full).host, ls = *low->at(rig.swa).host;
  fill(rig.full_dev, 3, 99);  // the freed device page is reused: the host copy must not follow it
  EXPECT_EQ(block(rig.full_host, lh[0].value(), 1)[0], 3 * 1000 + 100);
  EXPECT_EQ(block(rig.swa_host, ls[1].value(), 0)[0], (60 + 4) * 1000);
  unified::VerifyAccounts acc;
  rig.host->host_accounts(acc);
  rig.tree.verify(&acc);
  EXPECT_EQ(rig.tree.peek_prefix(std::span<const TokenId>(t).first(17)).host_matched, Tokens(16));
}

}  // namespace
}  // namespace kvgrid::cache
