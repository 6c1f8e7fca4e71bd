// The P/D transfer plan (runtime/pd.hpp pd_legs), pure layout arithmetic over every pair of small
// layouts: each decode rank receives every (layer, KV head) of its pool exactly once, from a
// prefill rank that holds it; every leg has its mirror on the other side (same global layer and
// heads), so sends and receives pair up; equal layouts pair rank w with w + group size only.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "core/topology.hpp"
#include "runtime/experiment.hpp"
#include "runtime/model.hpp"
#include "runtime/pd.hpp"

namespace kvgrid {
namespace {

ExperimentConfig model(const std::string& attention) {
  return parse_experiment("[model]\nlayers = 6\nkv_heads = 4\nattention = \"" + attention + "\"\n", "legs", {});
}

// (global layer, global head) → the prefill/decode world ranks of a leg seen from one side.
using Key = std::tuple<int, int, std::uint64_t, std::uint32_t>;  // sender, receiver, layer, head

std::set<Key> keys_of(const ExperimentConfig& exp, const TopologySpec& spec, int world_rank) {
  const GridCoord c = layout_coord(spec, world_rank);
  const ModelGeometry g = ModelGeometry::for_rank(exp, c, spec.groups[static_cast<std::size_t>(c.group)].shape);
  std::set<Key> out;
  for (const auto& leg : pd_legs(exp, spec, c))
    for (std::size_t h = leg.head_begin; h < leg.head_end; ++h) {
      const int s = c.group == 0 ? world_rank : leg.peer, r = c.group == 0 ? leg.peer : world_rank;
      EXPECT_TRUE(out.insert({s, r, g.layer_begin + leg.layer, g.kv_heads[h]}).second) << "a (layer, head) twice on one leg set";
    }
  return out;
}

TEST(PdLegs, EveryDecodeRankReceivesEachLayerAndHeadOnceFromAHolderAndSidesMirror) {
  std::vector<GridShape> shapes;
  for (int tp : {1, 2, 4})
    for (int cp : {1, 2})
      for (int pp : {1, 2, 3}) shapes.push_back({tp, cp, pp});
  for (const std::string attention : {"mha", "mla"}) {
    const auto exp = model(attention);
    for (const auto& p : shapes)
      for (const auto& d : shapes) {
        TopologySpec spec;
        spec.groups = {{"prefill", p}, {"decode", d}};
        SCOPED_TRACE(attention + " " + spec.str());
        std::set<Key> sent, received;
        for (int w = 0; w < spec.world_size(); ++w) {
          auto k = keys_of(exp, spec, w);
          (layout_coord(spec, w).group == 0 ? sent : received).insert(k.begin(), k.end());
        }
        EXPECT_EQ(sent, received) << "sends and receives must pair up";
        // Each decode rank: every (layer, head) of its pool exactly once, from a prefill rank holding it.
        std::map<std::tuple<int, std::uint64_t, std::uint32_t>, int> got;
        for (const auto& [s, r, l, h] : received) {
          ++got[{r, l, h}];
          const GridCoord sc = layout_coord(spec, s);
          const ModelGeometry sg = ModelGeometry::for_rank(exp, sc, p);
          EXPECT_TRUE(l >= sg.layer_begin && l < sg.layer_end) << "rank " << s << " does not hold layer " << l;
          EXPECT_TRUE(std::find(sg.kv_heads.begin(), sg.kv_heads.end(), h) != sg.kv_heads.end());
        }
        for (int w = p.size(); w < spec.world_size(); ++w) {
          const GridCoord c = layout_coord(spec, w);
          const ModelGeometry g = ModelGeometry::for_rank(exp, c, d);
          for (std::uint64_t l = g.layer_begin; l < g.layer_end; ++l)
            for (auto h : g.kv_heads) EXPECT_EQ((got[{w, l, h}]), 1) << "decode rank " << w << " layer " << l << " head " << h;
        }
        if (p.tp == d.tp && p.cp == d.cp && p.pp == d.pp) {
          for (const auto& [s, r, l, h] : sent) EXPECT_EQ(r, s + p.size()) << "equal layouts pair w with w + size";
        }
      }
  }
}

// CP-sharded pools (cache.cp_sharding = sharded), page-level: over shard groups that differ in size
// and axis (CP, or TP for MLA at CP 1), each decode rank receives each (layer, head) of every
// position it owns exactly once, from the prefill rank that holds that layer and head and owns
// that position; sends and receives pair up. Positions 0..35 cover every lcm of the sizes here.
TEST(PdLegs, ShardedPoolsMoveEachPageFromItsPrefillOwnerToItsDecodeOwner) {
  std::vector<GridShape> shapes;
  for (int tp : {1, 2, 4})
    for (int cp : {1, 2, 3})
      for (int pp : {1, 2}) shapes.push_back({tp, cp, pp});
  // (shard group size, this rank's shard) as rank_stack builds them (protocols/cp_sharding.hpp)
  auto owner = [](const GridShape& s, const GridCoord& c, bool mla) -> std::pair<int, int> {
    if (s.cp > 1) return {s.cp, c.cp};
    if (mla && s.tp > 1) return {s.tp, c.tp};
    return {1, 0};
  };
  using PageKey = std::tuple<int, int, std::uint64_t, std::uint32_t, int>;  // sender, receiver, layer, head, position
  for (const std::string attention : {"mha", "mla"}) {
    auto exp = model(attention);
    exp.cache.cp_sharding = "sharded";
    const bool mla = attention == "mla";
    for (const auto& p : shapes)
      for (const auto& d : shapes) {
        TopologySpec spec;
        spec.groups = {{"prefill", p}, {"decode", d}};
        SCOPED_TRACE(attention + " sharded " + spec.str());
        std::set<PageKey> sent, received;
        for (int w = 0; w < spec.world_size(); ++w) {
          const GridCoord c = layout_coord(spec, w);
          const ModelGeometry g = ModelGeometry::for_rank(exp, c, spec.groups[static_cast<std::size_t>(c.group)].shape);
          for (const auto& leg : pd_legs(exp, spec, c))
            for (int i = 0; i < 36; ++i) {
              if (static_cast<std::uint32_t>(i) % leg.page_mod != leg.page_res) continue;
              for (std::size_t h = leg.head_begin; h < leg.head_end; ++h) {
                const int s = c.group == 0 ? w : leg.peer, r = c.group == 0 ? leg.peer : w;
                EXPECT_TRUE((c.group == 0 ? sent : received).insert({s, r, g.layer_begin + leg.layer, g.kv_heads[h], i}).second);
              }
            }
        }
        EXPECT_EQ(sent, received) << "sends and receives must pair up";
        std::map<std::tuple<int, std::uint64_t, std::uint32_t, int>, int> got;
        for (const auto& [s, r, l, h, i] : received) {
          ++got[{r, l, h, i}];
          const GridCoord sc = layout_coord(spec, s);
          const ModelGeometry sg = ModelGeometry::for_rank(exp, sc, p);
          EXPECT_TRUE(l >= sg.layer_begin && l < sg.layer_end) << "rank " << s << " does not hold layer " << l;
          EXPECT_TRUE(std::find(sg.kv_heads.begin(), sg.kv_heads.end(), h) != sg.kv_heads.end());
          const auto [n, mine] = owner(p, sc, mla);
          EXPECT_EQ(i % n, mine) << "prefill rank " << s << " does not own position " << i;
        }
        for (int w = p.size(); w < spec.world_size(); ++w) {
          const GridCoord c = layout_coord(spec, w);
          const ModelGeometry g = ModelGeometry::for_rank(exp, c, d);
          const auto [n, mine] = owner(d, c, mla);
          for (std::uint64_t l = g.layer_begin; l < g.layer_end; ++l)
            for (auto h : g.kv_heads)
              for (int i = 0; i < 36; ++i)
                EXPECT_EQ((got[{w, l, h, i}]), i % n == mine ? 1 : 0) << "decode rank " << w << " layer " << l << " head " << h << " position " << i;
        }
      }
  }
}

TEST(PdLegs, HandComputedCp4PrefillIntoCp2DecodeSharded) {
  auto exp = model("mha");
  exp.cache.cp_sharding = "sharded";
  TopologySpec spec;
  spec.groups = {{"prefill", {1, 4, 1}}, {"decode", {1, 2, 1}}};
  // Decode CP rank 1 (world 5) owns odd positions: those ≡ 1 and ≡ 3 (mod 4) come from prefill CP ranks 1 and 3.
  auto legs = pd_legs(exp, spec, layout_coord(spec, 5));
  ASSERT_EQ(legs.size(), 12u);  // 6 layers × 2 owners
  EXPECT_EQ(legs[0], (PdLeg{1, 0, 0, 4, -1, 4, 1}));
  EXPECT_EQ(legs[1], (PdLeg{3, 0, 0, 4, -1, 4, 3}));
  // Prefill CP rank 2 (world 2) owns positions ≡ 2 (mod 4): all to decode CP rank 0 (world 4).
  legs = pd_legs(exp, spec, layout_coord(spec, 2));
  ASSERT_EQ(legs.size(), 6u);
  for (const auto& leg : legs) EXPECT_EQ(leg, (PdLeg{4, leg.layer, 0, 4, -1, 4, 2}));
}

// Speculative decoding: the draft's layers (on each group's last stage, heads split over TP) ride
// the suffix as transfer layers model.layers + d: every decode rank of the last stage receives
// each draft (layer, head) exactly once from a prefill rank of the last stage holding it, sides
// mirror, and target_only sends no draft leg.
TEST(PdLegs, DraftLayersGoFromLastStageToLastStageOnceEach) {
  for (const std::string mode : {"sidecar", "target_only"}) {
    auto exp = parse_experiment("[model]\nlayers = 6\nkv_heads = 4\n[model.draft]\nmode = \"" + mode + "\"\nlayers = 2\n"
                                "kv_heads = 2\n[workload]\nkind = \"gsp\"\n", "legs", {});
    for (int ptp : {1, 2})
      for (int ppp : {1, 2, 3})
        for (int dtp : {1, 2})
          for (int dpp : {1, 2}) {
            TopologySpec spec;
            spec.groups = {{"prefill", {ptp, 1, ppp}}, {"decode", {dtp, 1, dpp}}};
            SCOPED_TRACE(mode + " " + spec.str());
            std::set<Key> sent, received;
            for (int w = 0; w < spec.world_size(); ++w) {
              const GridCoord c = layout_coord(spec, w);
              const GridShape& sh = spec.groups[static_cast<std::size_t>(c.group)].shape;
              const ModelGeometry dg = ModelGeometry::draft_for_rank(exp, c, sh);
              for (const auto& leg : pd_legs(exp, spec, c)) {
                if (!leg.draft) continue;
                EXPECT_EQ(c.pp, sh.pp - 1) << "a draft leg off the last stage";
                for (std::size_t h = leg.head_begin; h < leg.head_end; ++h) {
                  const int s = c.group == 0 ? w : leg.peer, r = c.group == 0 ? leg.peer : w;
                  EXPECT_TRUE((c.group == 0 ? sent : received).insert({s, r, leg.layer, dg.kv_heads[h]}).second);
                }
              }
            }
            EXPECT_EQ(sent, received);
            if (mode == "target_only") {
              EXPECT_TRUE(received.empty()) << "target_only sends no draft KV";
              continue;
            }
            const int pre = ptp * ppp;
            for (int w = pre; w < spec.world_size(); ++w) {
              const GridCoord c = layout_coord(spec, w);
              if (c.pp != dpp - 1) continue;
              const ModelGeometry dg = ModelGeometry::draft_for_rank(exp, c, spec.groups[1].shape);
              for (std::uint64_t l = 0; l < 2; ++l)
                for (auto h : dg.kv_heads) {
                  int n = 0;
                  for (const auto& [s, r, ll, hh] : received) {
                    if (r != w || ll != l || hh != h) continue;
                    ++n;
                    const GridCoord sc = layout_coord(spec, s);
                    EXPECT_EQ(sc.pp, ppp - 1) << "from prefill's last stage";
                    const ModelGeometry sg = ModelGeometry::draft_for_rank(exp, sc, spec.groups[0].shape);
                    EXPECT_TRUE(std::find(sg.kv_heads.begin(), sg.kv_heads.end(), h) != sg.kv_heads.end());
                  }
                  EXPECT_EQ(n, 1) << "decode rank " << w << " draft layer " << l << " head " << h;
                }
            }
          }
  }
}

// Sidecars (hybrid models): each decode rank of the stage holding a sidecar's source kind's first
// layer gets exactly one leg of it, from a prefill rank of the stage holding that layer; sides mirror.
TEST(PdLegs, EachDecodeHolderOfASidecarReceivesItOnceFromAPrefillHolder) {
  const auto exp = parse_experiment(
      "[model]\nlayers = 6\nkv_heads = 4\nlayer_types = \"full,full,swa,mamba,swa,full\"\nswa_window = 8\n"
      "[[model.sidecar]]\nname = \"a\"\nsource = \"full\"\nwords = 1\n"
      "[[model.sidecar]]\nname = \"b\"\nsource = \"swa\"\nwords = 2\n[workload]\nkind = \"gsp\"\n",
      "legs", {});
  for (int ptp : {1, 2, 4})
    for (int ppp : {1, 2, 3})
      for (int dtp : {1, 2, 4})
        for (int dpp : {1, 2, 3}) {
          TopologySpec spec;
          spec.groups = {{"prefill", {ptp, 1, ppp}}, {"decode", {dtp, 1, dpp}}};
          SCOPED_TRACE(spec.str());
          std::set<std::tuple<int, int, int>> sent, received;  // (sender, receiver, sidecar)
          for (int w = 0; w < spec.world_size(); ++w) {
            const GridCoord c = layout_coord(spec, w);
            const ModelGeometry g = ModelGeometry::for_rank(exp, c, spec.groups[static_cast<std::size_t>(c.group)].shape);
            for (const auto& leg : pd_legs(exp, spec, c)) {
              if (leg.sidecar < 0) continue;
              const auto src = exp.model.sidecars[static_cast<std::size_t>(leg.sidecar)].source;
              EXPECT_TRUE(g.local_of(src) > 0 && g.kind_first[static_cast<std::size_t>(src)] == 0)
                  << "rank " << w << " does not hold sidecar " << leg.sidecar;
              (c.group == 0 ? sent : received).insert({c.group == 0 ? w : leg.peer, c.group == 0 ? leg.peer : w, leg.sidecar});
            }
          }
          EXPECT_EQ(sent, received);
          // The source's first layers: full at 0, swa at 2. Decode holders: every TP rank of that stage.
          const int pre = ptp * ppp;
          for (int sidecar : {0, 1}) {
            const std::uint64_t first = sidecar == 0 ? 0 : 2;
            int n = 0;
            for (int w = pre; w < spec.world_size(); ++w) {
              const GridCoord c = layout_coord(spec, w);
              const ModelGeometry g = ModelGeometry::for_rank(exp, c, spec.groups[1].shape);
              const bool holds = g.layer_begin <= first && first < g.layer_end;
              int legs = 0;
              for (const auto& [s, r, i] : received) legs += r == w && i == sidecar ? 1 : 0;
              EXPECT_EQ(legs, holds ? 1 : 0) << "decode rank " << w << " sidecar " << sidecar;
              n += legs;
            }
            EXPECT_EQ(n, dtp) << "one leg per TP rank of the decode stage holding sidecar " << sidecar;
          }
        }
}

TEST(PdLegs, HandComputedTp2PrefillIntoTp1Decode) {
  const auto exp = model("mha");
  TopologySpec spec;
  spec.groups = {{"prefill", {2, 1, 1}}, {"decode", {1, 1, 2}}};
  // Decode rank 2 (stage 0: layers 0-2, heads 0-3) gets heads 0-1 from rank 0 and 2-3 from rank 1.
  auto legs = pd_legs(exp, spec, layout_coord(spec, 2));
  ASSERT_EQ(legs.size(), 6u);
  EXPECT_EQ(legs[0], (PdLeg{0, 0, 0, 2}));
  EXPECT_EQ(legs[1], (PdLeg{1, 0, 2, 4}));
  // Prefill rank 1 (layers 0-5, heads 2-3): its heads, to decode rank 2 for layers 0-2, rank 3 for 3-5.
  legs = pd_legs(exp, spec, layout_coord(spec, 1));
  ASSERT_EQ(legs.size(), 6u);
  EXPECT_EQ(legs[0], (PdLeg{2, 0, 0, 2}));
  EXPECT_EQ(legs[5], (PdLeg{3, 5, 0, 2}));
}

}  // namespace
}  // namespace kvgrid
