// The unified storage layout (cache/unified_kv.hpp, kernels/relayout.hpp): namespace digests
// against Python's hashlib, each rank's objects for the article's Figure 4 layouts, misaligned
// ranks refused, the relayout kernel against a plain reference over a parameter grid, and pages
// written by one layout's pools read back by another layout's pool.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "cache/kv_pool.hpp"
#include "cache/unified_kv.hpp"
#include "core/check.hpp"

namespace kvgrid::cache {
namespace {

KvNamespace fig4_namespace() {
  KvNamespace ns;
  ns.model_id = "synth-l60-h8-d128-mha";
  ns.dtype = "u64-full";
  ns.page_size = 64;
  ns.total_kv_heads = 8;
  ns.layer_partition = 30;
  ns.head_group = 2;
  return ns;
}

std::vector<std::uint32_t> heads(std::uint32_t first, std::uint32_t n) {
  std::vector<std::uint32_t> h;
  for (std::uint32_t i = 0; i < n; ++i) h.push_back(first + i);
  return h;
}

std::vector<std::string> suffixes(const UnifiedPlan& p) {
  std::vector<std::string> s;
  for (const auto& c : p.chunks) s.push_back(c.suffix.substr(p.digest.size() + 2));
  return s;
}

TEST(UnifiedKv, NamespaceDigestMatchesSha256OfTheCanonicalFields) {
  // hashlib.sha256(canonical text).hexdigest()[:16], computed outside kvgrid
  const KvNamespace ns = fig4_namespace();
  EXPECT_EQ(canonical_text(ns),
            "schema_version=1\nmodel_id=synth-l60-h8-d128-mha\ndtype=u64-full\npage_size=64\nrank_replicated=false\n"
            "total_kv_heads=8\nlayer_partition=30\nhead_group=2\nobject_layout=page-unified-v1\ntenant=\n");
  EXPECT_EQ(namespace_digest(ns), "ukv1-c540c7a195e3b821");
  KvNamespace mla{"synth-l8-h1-d16-mla", "u64-digest", 16, true, 0, 4, 0, KvNamespace::kObjectLayout, "acme"};
  EXPECT_EQ(namespace_digest(mla), "ukv1-17fc2553649546f5");
}

TEST(UnifiedKv, AnyFieldChangeChangesTheDigest) {
  const std::string base = namespace_digest(fig4_namespace());
  std::vector<std::function<void(KvNamespace&)>> changes = {
      [](KvNamespace& n) { n.model_id = "synth-l60-h8-d64-mha"; }, [](KvNamespace& n) { n.dtype = "u64-digest"; },
      [](KvNamespace& n) { n.page_size = 32; },                    [](KvNamespace& n) { n.rank_replicated = true; },
      [](KvNamespace& n) { n.total_kv_heads = 16; },               [](KvNamespace& n) { n.layer_partition = 15; },
      [](KvNamespace& n) { n.head_group = 4; },                    [](KvNamespace& n) { n.object_layout = "page-unified-v2"; },
      [](KvNamespace& n) { n.tenant = "b"; }};
  std::set<std::string> seen{base};
  for (std::size_t i = 0; i < changes.size(); ++i) {
    KvNamespace ns = fig4_namespace();
    changes[i](ns);
    EXPECT_TRUE(seen.insert(namespace_digest(ns)).second) << "change " << i << " kept a digest";
  }
}

TEST(UnifiedKv, Figure4WriterRanksHoldOneObjectReaderRanksFour) {
  const KvNamespace ns = fig4_namespace();
  // TP4 x PP2: rank (tp, pp) holds heads 2tp..2tp+1 and layers 30pp..30pp+29: one object.
  for (std::uint32_t tp = 0; tp < 4; ++tp)
    for (std::uint64_t pp = 0; pp < 2; ++pp) {
      const auto p = plan_unified_kv(ns, 60, 30 * pp, 30 * pp + 30, heads(2 * tp, 2));
      ASSERT_EQ(p.chunks.size(), 1u);
      EXPECT_EQ(suffixes(p)[0], "L" + std::to_string(30 * pp) + "-" + std::to_string(30 * pp + 29) + "_H" + std::to_string(tp));
      EXPECT_EQ(p.chunks[0].local.layer0, 0u);
      EXPECT_EQ(p.chunks[0].local.heads, 2u);
    }
  // TP2 x PP1: TP0 combines groups 0 and 1 over both layer ranges, TP1 groups 2 and 3.
  const auto r0 = plan_unified_kv(ns, 60, 0, 60, heads(0, 4));
  EXPECT_EQ(suffixes(r0), (std::vector<std::string>{"L0-29_H0", "L0-29_H1", "L30-59_H0", "L30-59_H1"}));
  const auto r1 = plan_unified_kv(ns, 60, 0, 60, heads(4, 4));
  EXPECT_EQ(suffixes(r1), (std::vector<std::string>{"L0-29_H2", "L0-29_H3", "L30-59_H2", "L30-59_H3"}));
  EXPECT_EQ(r1.chunks[3].local.layer0, 30u);
  EXPECT_EQ(r1.chunks[3].local.head0, 2u);
  // A full key: page hash, namespace digest, bounds.
  const auto d = page_hash_chain(std::vector<TokenId>{1, 2, 3, 4}, 4)[0];
  EXPECT_EQ(unified_key(d, r0.chunks[2]), to_hex(d) + "_ukv1-c540c7a195e3b821_L30-59_H0");
}

TEST(UnifiedKv, DefaultsAndReplicatedModels) {
  KvNamespace ns = fig4_namespace();
  ns.layer_partition = 0;  // this rank's own range
  ns.head_group = 0;       // this rank's own heads
  const auto p = plan_unified_kv(ns, 60, 30, 60, heads(4, 2));
  EXPECT_EQ(suffixes(p), (std::vector<std::string>{"L30-59_H2"}));
  EXPECT_EQ(p.ns.head_group, 2u);
  // A ragged last range is allowed at the model's end.
  ns.layer_partition = 25;
  ns.head_group = 2;
  EXPECT_EQ(suffixes(plan_unified_kv(ns, 60, 50, 60, heads(0, 2))), (std::vector<std::string>{"L50-59_H0"}));
  // MLA: one latent replicated over TP, no _H.
  KvNamespace mla{"m", "u64-full", 16, true, 0, 4, 0, KvNamespace::kObjectLayout, ""};
  EXPECT_EQ(suffixes(plan_unified_kv(mla, 8, 0, 8, heads(0, 1))), (std::vector<std::string>{"L0-3", "L4-7"}));
}

TEST(UnifiedKv, MisalignedRanksAreRefusedWithTheNumbers) {
  KvNamespace ns = fig4_namespace();
  auto message = [&](std::uint64_t lb, std::uint64_t le, std::vector<std::uint32_t> h) -> std::string {
    try {
      plan_unified_kv(ns, 60, lb, le, h);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  // PP3 splits 60 layers as 0-19, 20-39, 40-59: not whole 30-layer ranges.
  EXPECT_NE(message(20, 40, heads(0, 2)).find("layers 20-39 of 60, not whole ranges of cache.storage_layer_partition = 30"),
            std::string::npos)
      << message(20, 40, heads(0, 2));
  // TP8 gives each rank one head: not a whole group of 2.
  EXPECT_NE(message(0, 60, heads(3, 1)).find("KV heads 3-3, not whole groups of cache.storage_head_partition = 2"),
            std::string::npos);
  ns.head_group = 3;  // 8 heads do not split into groups of 3
  EXPECT_NE(message(0, 60, heads(0, 4)).find("does not divide the model's 8 KV heads"), std::string::npos);
  KvNamespace mla{"m", "u64-full", 16, true, 0, 4, 2, KvNamespace::kObjectLayout, ""};
  EXPECT_THROW(plan_unified_kv(mla, 8, 0, 8, heads(0, 1)), InputError);
}

// --- the relayout kernel ----------------------------------------------------------------------

// Object order written out by hand: [layer in chunk][slot][head in group][dim] (digest: [layer][head]).
std::vector<std::uint64_t> reference_pack(const kernels::PageLayout& g, bool digest, const std::vector<std::uint64_t>& pool,
                                          const std::vector<std::uint32_t>& rows,
                                          const std::vector<kernels::ChunkSpan>& chunks) {
  std::vector<std::uint64_t> out;
  for (std::uint32_t r : rows)
    for (const auto& c : chunks)
      for (std::size_t l = c.layer0; l < c.layer0 + c.layers; ++l) {
        if (digest) {
          for (std::size_t h = c.head0; h < c.head0 + c.heads; ++h) out.push_back(pool[g.digest_index(r, l, h)]);
          continue;
        }
        for (std::size_t s = 0; s < g.page_size; ++s)
          for (std::size_t h = c.head0; h < c.head0 + c.heads; ++h)
            for (std::size_t d = 0; d < g.dims; ++d) out.push_back(pool[g.full_index(r, l, h, s, d)]);
      }
  return out;
}

// The grid tests' page layout (3 slots of 2 elements) and their chunks: layer ranges of `lp` x
// head groups of `hg`.
kernels::PageLayout small_layout(std::size_t pages, std::size_t layers, std::size_t heads) {
  kernels::PageLayout g;
  g.pages = pages;
  g.layers = layers;
  g.heads = heads;
  g.page_size = 3;
  g.dims = 2;
  return g;
}

std::vector<kernels::ChunkSpan> grid_chunks(std::size_t layers, std::size_t heads, std::size_t lp, std::size_t hg) {
  std::vector<kernels::ChunkSpan> chunks;
  for (std::size_t a = 0; a < layers; a += lp)
    for (std::size_t h = 0; h < heads; h += hg) chunks.push_back({a, std::min(lp, layers - a), h, hg});
  return chunks;
}

TEST(UnifiedKv, RelayoutMatchesAPlainReferenceOverAGrid) {
  const unsigned seed = 20261203;
  std::mt19937_64 rng(seed);
  std::cout << "seed " << seed << "\n";
  for (bool digest : {false, true})
    for (std::size_t layers : {1u, 3u, 4u})
      for (std::size_t heads_n : {1u, 2u, 4u})
        for (std::size_t lp : {1u, 2u, 4u})
          for (std::size_t hg : {1u, 2u, 4u}) {
            if (heads_n % hg != 0) continue;
            const kernels::PageLayout g = small_layout(5, layers, heads_n);
            std::vector<std::uint64_t> pool(digest ? g.digest_words() : g.full_words());
            for (auto& w : pool) w = rng();
            const auto chunks = grid_chunks(layers, heads_n, lp, hg);
            const std::vector<std::uint32_t> rows = {3, 1, 4};
            const auto want = reference_pack(g, digest, pool, rows, chunks);
            for (bool kokkos : {true, false}) {
              std::vector<std::uint64_t> got(want.size(), 0);
              kernels::pack_objects(g, digest, pool.data(), rows, chunks, got.data(), kokkos);
              ASSERT_EQ(got, want) << "digest " << digest << " layers " << layers << " heads " << heads_n << " lp " << lp
                                   << " hg " << hg << " kokkos " << kokkos;
              // Unpacking into a blank pool restores exactly the listed rows' words.
              std::vector<std::uint64_t> back(pool.size(), 0);
              kernels::unpack_objects(g, digest, back.data(), rows, chunks, got.data(), kokkos);
              const std::size_t row_words = pool.size() / g.pages;
              for (std::size_t r = 0; r < g.pages; ++r) {
                const bool listed = r == 1 || r == 3 || r == 4;
                for (std::size_t w = 0; w < row_words; ++w)
                  ASSERT_EQ(back[r * row_words + w], listed ? pool[r * row_words + w] : 0u) << "row " << r << " word " << w;
              }
            }
          }
}

// page_unified host pools (cache.host_layout = page_unified): the copies layer_copies makes from a
// layer-first device pool leave each host row equal to the relayout kernel's objects of that page
// (the plain reference above), the copies back rebuild the device rows word for word, and pack()
// of the host pool is its rows as they are — over the same grid, both payloads.
TEST(UnifiedKv, PageUnifiedRowsHoldTheObjectsTheRelayoutKernelPacks) {
  const unsigned seed = 20261206;
  std::mt19937_64 rng(seed);
  std::cout << "seed " << seed << "\n";
  for (Payload payload : {Payload::Full, Payload::Digest})
    for (std::uint64_t layers : {1u, 3u, 4u})
      for (std::uint32_t heads_n : {1u, 2u, 4u})
        for (std::size_t lp : {1u, 2u, 4u})
          for (std::uint32_t hg : {1u, 2u, 4u}) {
            if (heads_n % hg != 0) continue;
            const bool digest = payload == Payload::Digest;
            const auto chunks = grid_chunks(layers, heads_n, lp, hg);
            KvPoolConfig dc{Pages(5), Tokens(3), 7, layers, heads(0, heads_n), 2, payload};
            KvPoolConfig hc = dc;
            hc.object_chunks = chunks;
            KvPool device(dc), host(hc), back(dc);
            const std::vector<PageId> dev = {PageId(3), PageId(1), PageId(4)}, hp = {PageId(2), PageId(5), PageId(1)};
            for (PageId p : dev)
              for (std::size_t w = 0; w < device.row_words(); ++w) device.row_data(p)[w] = rng();
            const std::string at = "digest " + std::to_string(digest) + " layers " + std::to_string(layers) + " heads " +
                                   std::to_string(heads_n) + " lp " + std::to_string(lp) + " hg " + std::to_string(hg);
            auto run = [](const std::vector<std::vector<transfer::Copy>>& per_layer) {
              for (const auto& layer : per_layer)
                for (const auto& c : layer) std::memcpy(c.dst, c.src, c.bytes);
            };
            run(layer_copies(host, hp, device, dev));
            const kernels::PageLayout g = small_layout(6, layers, heads_n);
            std::vector<std::uint64_t> whole(6 * device.row_words(), 0);  // the pool's words (row 0: padding)
            for (std::uint32_t r = 1; r < 6; ++r)
              std::copy_n(device.row_data(PageId(r)), device.row_words(), whole.begin() + r * device.row_words());
            for (std::size_t i = 0; i < dev.size(); ++i) {
              const auto want = reference_pack(g, digest, whole, {dev[i].value()}, chunks);
              ASSERT_EQ(std::vector<std::uint64_t>(host.row_data(hp[i]), host.row_data(hp[i]) + host.row_words()), want) << at;
            }
            std::vector<std::uint64_t> packed(dev.size() * host.row_words());
            host.pack(hp, chunks, packed.data());
            std::vector<std::uint64_t> want_packed(packed.size());
            device.pack(dev, chunks, want_packed.data());
            ASSERT_EQ(packed, want_packed) << at;
            // Any of its chunks alone (a part of the row: a packed draft's objects after the target's).
            const std::vector<kernels::ChunkSpan> last = {chunks.back()};
            std::vector<std::uint64_t> one(dev.size() * host.object_words(last[0])), want_one(one.size());
            host.pack(hp, last, one.data());
            device.pack(dev, last, want_one.data());
            ASSERT_EQ(one, want_one) << at;
            for (auto& w : one) w = ~w;  // unpacked in place: only that chunk's words change
            host.unpack(hp, last, one.data());
            host.pack(hp, last, want_one.data());
            ASSERT_EQ(one, want_one) << at;
            for (auto& w : one) w = ~w;
            host.unpack(hp, last, one.data());
            EXPECT_EQ(host.page_folds(hp), device.page_folds(dev)) << at;
            run(layer_copies(back, dev, host, hp));
            for (PageId p : dev)
              ASSERT_EQ(0, std::memcmp(back.row_data(p), device.row_data(p), device.row_words() * sizeof(std::uint64_t))) << at;
            // Each layer's copies cover its block exactly: one copy per (page, layer) where both sides
            // are contiguous (digest; one head per group), one per (head, slot) run otherwise.
            const auto per_layer = layer_copies(host, hp, device, dev);
            for (std::size_t l = 0; l < layers; ++l) {
              std::size_t bytes = 0;
              for (const auto& c : per_layer[l]) bytes += c.bytes;
              EXPECT_EQ(bytes, dev.size() * device.layer_block_bytes()) << at << " layer " << l;
              EXPECT_EQ(per_layer[l].size(), dev.size() * host.layer_runs(l).size()) << at;
              if (digest || hg == 1) {
                EXPECT_LE(host.layer_runs(l).size(), heads_n / hg) << at;
              }
            }
          }
}

TEST(UnifiedKv, PageUnifiedPoolsRefuseLayerReadsAndChunksThatDoNotTile) {
  KvPoolConfig c{Pages(2), Tokens(4), 0, 2, heads(0, 2), 1, Payload::Digest};
  c.object_chunks = {{0, 2, 0, 1}};  // head 1 missing
  try {
    KvPool bad(c);
    FAIL() << "chunks that miss a head were accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("do not tile"), std::string::npos) << e.what();
  }
  c.object_chunks = {{0, 2, 0, 1}, {0, 2, 1, 1}};
  KvPool ok(c);
  EXPECT_THROW((void)ok.layer_block(PageId(1), 0), std::exception);
  const std::vector<std::uint32_t> page = {1}, slot = {0};
  const std::vector<std::uint64_t> F = {5};
  EXPECT_THROW(ok.write(page, slot, F), std::exception);
  std::vector<std::uint64_t> staging(8);
  const std::vector<kernels::ChunkSpan> other = {{0, 2, 0, 2}};
  EXPECT_THROW(ok.pack(std::vector<PageId>{PageId(1)}, other, staging.data()), std::exception);
}

// Pools of a TP2 x PP2 writer (each rank: 2 of 4 heads, 2 of 4 layers) pack a page into objects;
// a TP1 x PP1 reader's pool assembles the same page from their objects and holds exactly what it
// would have computed itself (and a TP4 reader, one head each, too).
TEST(UnifiedKv, ObjectsOfOneLayoutRebuildThePagesOfAnother) {
  for (Payload payload : {Payload::Full, Payload::Digest}) {
    KvNamespace ns{"m", "u64", 4, false, 4, 2, 1, KvNamespace::kObjectLayout, ""};
    auto make_pool = [&](std::uint64_t layer_base, std::uint64_t layers, std::vector<std::uint32_t> h) {
      return KvPool(KvPoolConfig{Pages(4), Tokens(4), layer_base, layers, std::move(h), 3, payload});
    };
    const std::vector<std::uint32_t> page = {1, 1, 1, 1}, slot = {0, 1, 2, 3};
    const std::vector<std::uint64_t> F = {0x1234, 0x9999, 0xabcdef, 0x42};
    const auto digest = page_hash_chain(std::vector<TokenId>{7, 8, 9, 10}, 4)[0];
    std::map<std::string, std::vector<std::uint64_t>> store;
    for (std::uint32_t tp = 0; tp < 2; ++tp)
      for (std::uint64_t pp = 0; pp < 2; ++pp) {
        KvPool w = make_pool(2 * pp, 2, heads(2 * tp, 2));
        w.reset(std::vector<PageId>{PageId(1)});
        w.write(page, slot, F);
        const auto plan = plan_unified_kv(ns, 4, 2 * pp, 2 * pp + 2, w.head_ids());
        std::vector<kernels::ChunkSpan> spans;
        std::size_t words = 0;
        for (const auto& c : plan.chunks) {
          spans.push_back(c.local);
          words += w.object_words(c.local);
        }
        std::vector<std::uint64_t> staging(words);
        w.pack(std::vector<PageId>{PageId(1)}, spans, staging.data());
        std::size_t at = 0;
        for (const auto& c : plan.chunks) {
          const std::size_t n = w.object_words(c.local);
          EXPECT_TRUE(store.emplace(unified_key(digest, c), std::vector<std::uint64_t>(staging.begin() + at, staging.begin() + at + n)).second);
          at += n;
        }
      }
    EXPECT_EQ(store.size(), 8u);  // 2 layer ranges x 4 head groups
    for (std::uint32_t readers : {1u, 4u}) {
      for (std::uint32_t tp = 0; tp < readers; ++tp) {
        const std::uint32_t hn = 4 / readers;
        KvPool mine = make_pool(0, 4, heads(tp * hn, hn)), direct = make_pool(0, 4, heads(tp * hn, hn));
        direct.reset(std::vector<PageId>{PageId(1)});
        direct.write(page, slot, F);
        const auto plan = plan_unified_kv(ns, 4, 0, 4, mine.head_ids());
        std::vector<kernels::ChunkSpan> spans;
        std::vector<std::uint64_t> staging;
        for (const auto& c : plan.chunks) {
          spans.push_back(c.local);
          const auto& obj = store.at(unified_key(digest, c));
          staging.insert(staging.end(), obj.begin(), obj.end());
        }
        mine.unpack(std::vector<PageId>{PageId(2)}, spans, staging.data());  // another row: ids are free
        EXPECT_EQ(mine.page_folds(std::vector<PageId>{PageId(2)}), direct.page_folds(std::vector<PageId>{PageId(1)}))
            << "reader tp " << tp << " of " << readers;
        for (std::size_t l = 0; l < 4; ++l)
          EXPECT_EQ(0, std::memcmp(mine.layer_block(PageId(2), l), direct.layer_block(PageId(1), l), direct.layer_block_bytes()));
      }
    }
  }
}

// MAMBA states under unified keys: a TP2 x PP2 writer's slots ([layer][head][word] over 1 of 2
// MAMBA layers and 2 of 4 heads) packed into chunk objects — checked word by word against the
// object layout [layer in chunk][head in group][word] — rebuild a TP1 reader's whole slot and a
// TP4 reader's one-head slots.
TEST(UnifiedKv, StateObjectsOfOneLayoutRebuildTheStatesOfAnother) {
  constexpr std::size_t kWords = 3;
  auto value = [](std::size_t layer, std::size_t head, std::size_t w) { return 1000 * layer + 10 * head + w + 1; };
  std::map<std::pair<std::size_t, std::size_t>, std::vector<std::uint64_t>> store;  // (layer, head group) -> object
  for (std::size_t tp = 0; tp < 2; ++tp)
    for (std::size_t pp = 0; pp < 2; ++pp) {  // one MAMBA layer per stage, heads 2tp, 2tp+1
      std::vector<std::uint64_t> slot;
      for (std::size_t h = 0; h < 2; ++h)
        for (std::size_t w = 0; w < kWords; ++w) slot.push_back(value(pp, 2 * tp + h, w));
      const std::vector<kernels::ChunkSpan> spans = {{0, 1, 0, 1}, {0, 1, 1, 1}};  // head groups of 1
      std::vector<std::uint64_t> staging(2 * kernels::state_object_words(kWords, spans[0]));
      ASSERT_EQ(staging.size(), 2 * kWords);
      kernels::pack_state_objects(slot, 2, kWords, spans, staging.data());
      for (std::size_t g = 0; g < 2; ++g) {
        std::vector<std::uint64_t> obj(staging.begin() + static_cast<std::ptrdiff_t>(g * kWords),
                                       staging.begin() + static_cast<std::ptrdiff_t>((g + 1) * kWords));
        for (std::size_t w = 0; w < kWords; ++w) EXPECT_EQ(obj[w], value(pp, 2 * tp + g, w));
        store[{pp, 2 * tp + g}] = obj;
      }
    }
  // TP1: both layers, 4 heads, chunks layer-major then head group (plan_unified_kv's order).
  std::vector<kernels::ChunkSpan> spans;
  std::vector<std::uint64_t> staging;
  for (std::size_t l = 0; l < 2; ++l)
    for (std::size_t h = 0; h < 4; ++h) {
      spans.push_back({l, 1, h, 1});
      staging.insert(staging.end(), store.at({l, h}).begin(), store.at({l, h}).end());
    }
  std::vector<std::uint64_t> whole(2 * 4 * kWords, 0);
  kernels::unpack_state_objects(whole, 4, kWords, spans, staging.data());
  for (std::size_t l = 0; l < 2; ++l)
    for (std::size_t h = 0; h < 4; ++h)
      for (std::size_t w = 0; w < kWords; ++w) EXPECT_EQ(whole[(l * 4 + h) * kWords + w], value(l, h, w)) << l << " " << h;
  // TP4, rank 3: head 3 of both layers.
  std::vector<std::uint64_t> one(2 * kWords, 0), objs = store.at({0, 3});
  objs.insert(objs.end(), store.at({1, 3}).begin(), store.at({1, 3}).end());
  const std::vector<kernels::ChunkSpan> mine = {{0, 1, 0, 1}, {1, 1, 0, 1}};
  kernels::unpack_state_objects(one, 1, kWords, mine, objs.data());
  for (std::size_t l = 0; l < 2; ++l)
    for (std::size_t w = 0; w < kWords; ++w) EXPECT_EQ(one[l * kWords + w], value(l, 3, w));
  // A chunk outside the slot is a bug, not a silent overrun.
  const std::vector<kernels::ChunkSpan> bad = {{1, 1, 0, 1}};
  EXPECT_THROW(kernels::unpack_state_objects(one, 2, kWords, bad, objs.data()), std::exception);
}

}  // namespace
}  // namespace kvgrid::cache
