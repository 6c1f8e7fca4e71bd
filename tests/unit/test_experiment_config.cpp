// Experiment files: one validation pass with messages that name file, key, expected and found.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "core/check.hpp"
#include "runtime/experiment.hpp"
#include "runtime/model.hpp"
#include "runtime/storage_keys.hpp"

namespace kvgrid {
namespace {

std::string error_of(std::string_view toml, std::vector<std::string> sets = {}) {
  try {
    parse_experiment(toml, "exp.toml", sets);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

void expect_contains(const std::string& s, const std::string& part) {
  EXPECT_NE(s.find(part), std::string::npos) << "message: " << s << "\nexpected to contain: " << part;
}

TEST(ExperimentConfig, DefaultsFillEveryKey) {
  auto e = parse_experiment("", "empty", {});
  EXPECT_EQ(e.topology.str(), "TP1xCP1xPP1");
  EXPECT_EQ(e.cache.page_size, Tokens(16));
  EXPECT_EQ(e.engine.seed, 1u);
  EXPECT_GE(e.engine.deadline_s, 60.0);
  EXPECT_TRUE(e.faults.empty());
}

TEST(ExperimentConfig, ValuesAreRead) {
  auto e = parse_experiment(R"(
[topology]
tp = 2
pp = 2
[cache]
page_size = 32
device_pages = 100
[faults."rank.stall"]
probability = 0.25
ranks = [1, 3]
duration_ms = 50
)", "x", {});
  EXPECT_EQ(e.topology.str(), "TP2xCP1xPP2");
  EXPECT_EQ(e.cache.device_pages, Pages(100));
  ASSERT_EQ(e.faults.size(), 1u);
  EXPECT_EQ(e.faults[0].probability, 0.25);
  EXPECT_EQ(e.faults[0].ranks, (std::vector<std::int64_t>{1, 3}));
  EXPECT_EQ(e.faults[0].params.at("duration_ms"), 50.0);
}

TEST(ExperimentConfig, UnknownKeyNamesFileLineAndKey) {
  auto m = error_of("[cache]\npage_size = 16\npage_sise = 4\n");
  expect_contains(m, "exp.toml:3:");
  expect_contains(m, "unknown key 'cache.page_sise'");
  expect_contains(error_of("[cahce]\nx = 1\n"), "unknown key 'cahce'");
  expect_contains(error_of("[faults.\"rank.stal\"]\nprobability = 1\n"), "unknown key 'faults.\"rank.stal\"'");
}

TEST(ExperimentConfig, WrongTypeNamesExpectedAndFound) {
  auto m = error_of("[cache]\npage_size = \"big\"\n");
  expect_contains(m, "exp.toml:2:");
  expect_contains(m, "'cache.page_size'");
  expect_contains(m, "expected integer");
  expect_contains(m, "found string \"big\"");
  expect_contains(error_of("[engine]\ndebug_checks = 1\n"), "expected boolean");
  expect_contains(error_of("[model]\nattention = \"gqa\"\n"), "one of \"mha\" \"mla\"");
}

TEST(ExperimentConfig, OutOfRangeIsRejected) {
  auto m = error_of("[topology]\ntp = 0\n");
  expect_contains(m, "'topology.tp'");
  expect_contains(m, "out of range");
  expect_contains(error_of("[faults.\"rank.stall\"]\nprobability = 1.5\n"), "out of range");
}

TEST(ExperimentConfig, MalformedTomlGivesLineAndColumn) {
  auto m = error_of("[cache]\npage_size = = 3\n");
  expect_contains(m, "exp.toml:2:");
  expect_contains(m, "malformed TOML");
}

TEST(ExperimentConfig, SetOverridesAreValidatedLikeTheFile) {
  auto e = parse_experiment("[cache]\npage_size = 16\n", "x", {"cache.page_size=64", "model.attention=mla",
                                                               "faults.rank.stall.probability=0.5"});
  EXPECT_EQ(e.cache.page_size, Tokens(64));
  EXPECT_EQ(e.model.attention, "mla");
  ASSERT_EQ(e.faults.size(), 1u);
  EXPECT_EQ(e.faults[0].probability, 0.5);
  expect_contains(error_of("", {"cache.pagesize=3"}), "--set cache.pagesize=3: unknown key");
  expect_contains(error_of("", {"cache.page_size=abc"}), "expected integer");
  expect_contains(error_of("", {"cache.page_size"}), "expected key.path=value");
  expect_contains(error_of("", {"model.attention=gqa"}), "--set model.attention=gqa");
}

TEST(ExperimentConfig, RelationsBetweenKeysAreChecked) {
  expect_contains(error_of("[topology]\npp = 4\n[model]\nlayers = 2\n"), "model.layers = 2");
  expect_contains(error_of("[topology]\ntp = 3\n[model]\nkv_heads = 8\n"), "not divisible");
  EXPECT_EQ(error_of("[topology]\ntp = 3\n[model]\nkv_heads = 8\nattention = \"mla\"\n"), "");
  expect_contains(error_of("[workload.tree]\nprompt_tokens_min = 10\nprompt_tokens_max = 5\n"), "prompt_tokens_min");
  auto e = parse_experiment("[debug]\nkill_rank = 8\n", "x", {});
  EXPECT_THROW(e.validate_for_world(8), InputError);
  EXPECT_NO_THROW(e.validate_for_world(9));
}

TEST(ExperimentConfig, TwoGroupWorld) {
  auto e = parse_experiment("[topology.prefill]\ntp = 2\npp = 2\n[topology.decode]\ntp = 2\n", "pd", {});
  ASSERT_EQ(e.topology.groups.size(), 2u);
  EXPECT_EQ(e.topology.world_size(), 6);
  EXPECT_EQ(e.topology.groups[0].name, "prefill");
  expect_contains(error_of("[topology.prefill]\ntp = 2\n"), "needs both");
  // The groups' layouts may differ; each still has to split the model.
  EXPECT_NO_THROW(parse_experiment("[topology.prefill]\ntp = 2\npp = 2\n[topology.decode]\ntp = 2\n[workload]\nkind = \"gsp\"\n", "pd", {}));
  expect_contains(error_of("[topology.prefill]\ntp = 3\n[topology.decode]\ntp = 2\n[workload]\nkind = \"gsp\"\n[model]\nkv_heads = 4\n"),
                  "is not divisible by the prefill group's tp = 3");
  // Speculative decoding: a draft rides the suffix, a hybrid draft's windows and states too.
  EXPECT_NO_THROW(parse_experiment("[topology.prefill]\ntp = 2\n[topology.decode]\npp = 2\n[workload]\nkind = \"gsp\"\n"
                                   "[model.draft]\nmode = \"sidecar\"\n",
                                   "pd", {}));
  EXPECT_NO_THROW(parse_experiment("[topology.prefill]\ntp = 1\n[topology.decode]\ntp = 1\n[workload]\nkind = \"gsp\"\n[model]\n"
                                   "layer_types = \"full,swa\"\nswa_window = 8\n[model.draft]\nmode = \"sidecar\"\nlayer_types = \"full,swa\"\n",
                                   "pd", {}));
  // Sharded pools pair page owners, whatever the two shard groups.
  EXPECT_NO_THROW(parse_experiment("[topology.prefill]\ncp = 2\n[topology.decode]\ncp = 1\ntp = 2\n[workload]\nkind = \"gsp\"\n[cache]\n"
                                   "cp_sharding = \"sharded\"\n",
                                   "pd", {}));
  EXPECT_NO_THROW(parse_experiment("[topology.prefill]\ncp = 2\n[topology.decode]\ncp = 2\npp = 2\n[workload]\nkind = \"gsp\"\n"
                                   "[cache]\ncp_sharding = \"sharded\"\n",
                                   "pd", {}));
  EXPECT_NO_THROW(parse_experiment("[topology.prefill]\ntp = 2\n[topology.decode]\ntp = 2\n[workload]\nkind = \"gsp\"\n", "pd", {}));
  expect_contains(error_of("[topology]\ntp = 2\n[topology.decode]\ntp = 1\n[topology.prefill]\ntp = 1\n"),
                  "a P/D world sets its degrees");
}

TEST(ExperimentConfig, EffectiveConfigurationRoundTrips) {
  auto e = parse_experiment("[topology]\ntp = 2\n[workload.tree]\nfollowup_prob = 0.35\n[faults.\"rank.stall\"]\nprobability = 0.1\n",
                            "x", {"engine.seed=77"});
  EXPECT_NE(e.effective_toml.find("followup_prob = 0.35\n"), std::string::npos) << e.effective_toml;
  auto again = parse_experiment(e.effective_toml, "again", {});
  EXPECT_EQ(again.effective_toml, e.effective_toml);
  EXPECT_EQ(again.engine.seed, 77u);
  EXPECT_EQ(again.faults.size(), 1u);
}

TEST(ExperimentConfig, FileErrors) {
  EXPECT_THROW(load_experiment("/nonexistent/x.toml", {}), InputError);
  try {
    load_experiment("/", {});
    FAIL() << "a directory is not an experiment file";
  } catch (const InputError& e) {
    expect_contains(e.what(), "/");
  }
}

TEST(ExperimentConfig, ShippedExperimentsAreValid) {
  for (const char* f : {"quickstart.toml"}) {
    auto e = load_experiment(std::string(KVGRID_SOURCE_DIR) + "/experiments/" + f, {});
    EXPECT_EQ(e.name, "quickstart");
    EXPECT_EQ(e.topology.world_size(), 8);
  }
}

}  // namespace
}  // namespace kvgrid

namespace kvgrid {
namespace {

// [[model.sidecar]]: an array of tables, read in file order with per-element defaults, printed
// back by effective_toml so that the trace's configuration reproduces the run.
TEST(ExperimentConfig, ArraysOfTablesRoundTrip) {
  const std::string toml =
      "[model]\nlayer_types = \"full,swa\"\nswa_window = 8\n[[model.sidecar]]\nname = \"indexer\"\nwords = 3\n"
      "[[model.sidecar]]\nname = \"c4\"\nsource = \"swa\"\n[workload]\nkind = \"gsp\"\n";
  const auto e = parse_experiment(toml, "arrays", {});
  ASSERT_EQ(e.model.sidecars.size(), 2u);
  EXPECT_EQ(e.model.sidecars[0].name, "indexer");
  EXPECT_EQ(e.model.sidecars[0].source, LayerKind::Full);  // the default
  EXPECT_EQ(e.model.sidecars[0].words, 3);
  EXPECT_EQ(e.model.sidecars[1].name, "c4");
  EXPECT_EQ(e.model.sidecars[1].source, LayerKind::Swa);
  EXPECT_EQ(e.model.sidecars[1].words, 1);
  const auto again = parse_experiment(e.effective_toml, "again", {});
  ASSERT_EQ(again.model.sidecars.size(), 2u);
  EXPECT_EQ(again.model.sidecars[1].name, "c4");
  EXPECT_EQ(again.model.sidecars[1].source, LayerKind::Swa);
  EXPECT_EQ(again.effective_toml, e.effective_toml);
  // A table where an array of tables belongs, and a word of the wrong type, are named.
  EXPECT_THROW(
      {
        try {
          parse_experiment("[model.sidecar]\nname = \"x\"\n", "t", {});
        } catch (const InputError& x) {
          EXPECT_NE(std::string(x.what()).find("expected an array of tables ([[model.sidecar]])"), std::string::npos) << x.what();
          throw;
        }
      },
      InputError);
  EXPECT_THROW(parse_experiment("[[model.sidecar]]\nname = \"x\"\nwords = \"two\"\n", "t", {}), InputError);
}

}  // namespace
}  // namespace kvgrid

namespace kvgrid {
namespace {

// cache.component_bugs: an array of strings whose elements are checked against the bug list; a
// single string is a list of one, `--set` takes bare words separated by commas.
TEST(ExperimentConfig, StringArraysOfChoices) {
  const std::string hybrid = "[model]\nlayer_types = \"full,swa,mamba\"\nswa_window = 8\n[workload]\nkind = \"gsp\"\n";
  auto e = parse_experiment(hybrid + "[cache]\ncomponent_bugs = [\"shared_state_slot\", \"floored_frontier\"]\n", "x", {});
  EXPECT_EQ(e.cache.component_bugs, (std::vector<std::string>{"shared_state_slot", "floored_frontier"}));
  EXPECT_NE(e.effective_toml.find("component_bugs = [\"shared_state_slot\", \"floored_frontier\"]"), std::string::npos)
      << e.effective_toml;
  EXPECT_EQ(parse_experiment(e.effective_toml, "again", {}).cache.component_bugs, e.cache.component_bugs);
  EXPECT_TRUE(parse_experiment(hybrid, "x", {}).cache.component_bugs.empty());
  EXPECT_EQ(parse_experiment(hybrid, "x", {"cache.component_bugs=state_at_floor,read_past_boundary"}).cache.component_bugs,
            (std::vector<std::string>{"state_at_floor", "read_past_boundary"}));
  EXPECT_EQ(parse_experiment(hybrid + "[cache]\ncomponent_bugs = \"heal_frees_stale\"\n", "x", {}).cache.component_bugs,
            (std::vector<std::string>{"heal_frees_stale"}));
  expect_contains(error_of(hybrid + "[cache]\ncomponent_bugs = [\"nonsense\"]\n"),
                  "exp.toml:7:18: key 'cache.component_bugs': expected array of strings (one of \"swa_run_across_tombstones\"");
  expect_contains(error_of(hybrid + "[cache]\ncomponent_bugs = [\"nonsense\"]\n"), "found an array containing \"nonsense\"");
  expect_contains(error_of(hybrid + "[cache]\ncomponent_bugs = [3]\n"), "found an array containing integer 3");
  expect_contains(error_of(hybrid, {"cache.component_bugs=nonsense"}), "--set cache.component_bugs=nonsense");
  EXPECT_EQ(parse_experiment(hybrid, "x", {"cache.component_bugs=state_at_floor, read_past_boundary,"}).cache.component_bugs,
            (std::vector<std::string>{"state_at_floor", "read_past_boundary"}));
  EXPECT_EQ(parse_experiment(hybrid + "[cache]\ncomponent_bugs = \"heal_frees_stale , floored_frontier\"\n", "x", {}).cache.component_bugs,
            (std::vector<std::string>{"heal_frees_stale", "floored_frontier"}));
  // A bug planted in a component the model lacks would change nothing: refused by name.
  expect_contains(error_of("[model]\nlayer_types = \"full,mamba\"\n[workload]\nkind = \"gsp\"\n[cache]\ncomponent_bugs = [\"floored_frontier\"]\n"),
                  "cache.component_bugs: \"floored_frontier\" is planted in the SWA component, but model.layer_types = \"full,mamba\" has no swa layers");
  expect_contains(error_of("[model]\nlayer_types = \"full,swa\"\nswa_window = 8\n[workload]\nkind = \"gsp\"\n", {"cache.component_bugs=shared_state_slot"}),
                  "is planted in the MAMBA component");
  // The bugs live in the hybrid cache: a full-attention model refuses them by name.
  expect_contains(error_of("[cache]\ncomponent_bugs = [\"shared_state_slot\"]\n"),
                  "cache.component_bugs = [\"shared_state_slot\", ...] plants bugs in the hybrid cache's components");
}

// cache.host_layout = page_unified: only with unified keys and a host tier — refused otherwise
// with both keys named; hybrid models, drafts and CP page sharding are accepted.
TEST(ExperimentConfig, PageUnifiedHostPagesNeedUnifiedKeysAndAHostTier) {
  const std::string ok = "[cache]\nhost_pages = 64\nstorage = \"file\"\nstorage_key_scheme = \"unified\"\nhost_layout = \"page_unified\"\n"
                         "[workload]\nkind = \"gsp\"\n";
  EXPECT_EQ(error_of(ok), "");
  const std::string pu = "cache.host_layout = \"page_unified\" with ";
  expect_contains(error_of(ok, {"cache.storage_key_scheme=rank_suffix"}), pu + "cache.storage_key_scheme = \"rank_suffix\"");
  expect_contains(error_of(ok, {"cache.host_pages=0", "cache.storage=none"}), pu + "cache.host_pages = 0");
  EXPECT_EQ(error_of(ok + "[model]\nlayer_types = \"full,swa\"\nswa_window = 8\n"), "");  // hybrid: FULL and SWA host pools
  for (const char* draft : {"model.draft.mode=packed", "model.draft.mode=sidecar", "model.draft.mode=target_only"})
    EXPECT_EQ(error_of(ok, {draft}), "") << draft;
  EXPECT_EQ(error_of(ok, {"cache.cp_sharding=sharded", "topology.cp=2"}), "");
}

// Hybrid models under unified keys: each component kind has its own namespace, and its chunks
// hold only that kind's layers of each grid range, counted in the kind's own pool.
TEST(ExperimentConfig, HybridUnifiedObjectsPerComponentKind) {
  const std::string toml =
      "[model]\nlayers = 8\nkv_heads = 4\nlayer_types = \"full,swa,full,mamba\"\nswa_window = 32\n"
      "[cache]\nhost_pages = 64\nhost_swa_pages = 32\nhost_mamba_slots = 8\nstorage = \"file\"\nstorage_key_scheme = \"unified\"\nstorage_layer_partition = 2\n"
      "storage_head_partition = 2\n[workload]\nkind = \"gsp\"\n";
  const auto e = parse_experiment(toml, "x", {"topology.tp=2", "topology.pp=2"});
  GridShape shape;
  shape.tp = 2;
  shape.pp = 2;
  GridCoord at;
  at.tp = 1;
  at.pp = 1;  // layers 4-7 (full, swa, full, mamba), heads 2-3
  const ModelGeometry geo = ModelGeometry::for_rank(e, at, shape);
  auto spans = [&](LayerKind k) {
    std::vector<std::string> out;
    for (const auto& c : unified_component_plan(e, geo, k).chunks)
      out.push_back("L" + std::to_string(c.layer_first) + "-" + std::to_string(c.layer_last) + " H" +
                    std::to_string(*c.head_group) + " local " + std::to_string(c.local.layer0) + "+" +
                    std::to_string(c.local.layers) + " heads " + std::to_string(c.local.head0) + "+" +
                    std::to_string(c.local.heads));
    return out;
  };
  EXPECT_EQ(spans(LayerKind::Full), (std::vector<std::string>{"L4-5 H1 local 0+1 heads 0+2", "L6-7 H1 local 1+1 heads 0+2"}));
  EXPECT_EQ(spans(LayerKind::Swa), (std::vector<std::string>{"L4-5 H1 local 0+1 heads 0+2"}));
  EXPECT_EQ(spans(LayerKind::Mamba), (std::vector<std::string>{"L6-7 H1 local 0+1 heads 0+2"}));
  const std::string full = cache::namespace_digest(component_namespace(e, LayerKind::Full));
  const std::string swa = cache::namespace_digest(component_namespace(e, LayerKind::Swa));
  const std::string mamba = cache::namespace_digest(component_namespace(e, LayerKind::Mamba));
  EXPECT_NE(full, swa);
  EXPECT_NE(full, mamba);
  EXPECT_NE(swa, mamba);
  EXPECT_NE(full, cache::namespace_digest(storage_namespace(e)));  // the layer kinds are part of the model
  // Another layer pattern over the same layers is another model.
  const auto other = parse_experiment(toml, "x", {"model.layer_types=full,full,swa,mamba"});
  EXPECT_NE(full, cache::namespace_digest(component_namespace(other, LayerKind::Full)));
  // A sidecar is a namespace of its own, tied to its source's and its own name and width.
  const auto sc = parse_experiment(toml + "[[model.sidecar]]\nname = \"idx\"\nsource = \"full\"\nwords = 1\n", "x", {});
  const auto idx = unified_sidecar_plan(sc, sc.model.sidecars.at(0));
  ASSERT_EQ(idx.chunks.size(), 1u);
  EXPECT_FALSE(idx.chunks[0].head_group.has_value()) << "replicated: every holder keeps it whole";
  EXPECT_NE(idx.digest, full);
  auto wider = sc.model.sidecars.at(0);
  wider.words = 2;
  EXPECT_NE(unified_sidecar_plan(sc, wider).digest, idx.digest);
  wider = sc.model.sidecars.at(0);
  wider.source = LayerKind::Swa;
  EXPECT_NE(unified_sidecar_plan(sc, wider).digest, idx.digest);
  // A hybrid draft: a namespace per kind of its own, chunks over its layers of that kind (one range,
  // the target's head groups); a FULL-only draft's FULL objects are unified_draft_plan's.
  const auto d = parse_experiment(toml + "[model.draft]\nmode = \"packed\"\nlayers = 3\nlayer_types = \"full,swa,mamba\"\n", "x",
                                  {"topology.tp=2", "topology.pp=2"});
  const ModelGeometry dg = ModelGeometry::draft_for_rank(d, at, shape);
  std::set<std::string> digests{full, swa, mamba};
  for (LayerKind k : {LayerKind::Full, LayerKind::Swa, LayerKind::Mamba}) {
    const auto plan = unified_draft_component_plan(d, dg, k);
    ASSERT_EQ(plan.chunks.size(), 1u) << layer_kind_name(k) << ": heads 2-3 are one group of 2";
    EXPECT_EQ(plan.chunks[0].layer_first, 0u);
    EXPECT_EQ(plan.chunks[0].layer_last, 2u);
    EXPECT_EQ(plan.chunks[0].local.layer0, 0u);
    EXPECT_EQ(plan.chunks[0].local.layers, 1u) << "one draft layer of each kind";
    EXPECT_TRUE(digests.insert(plan.digest).second) << layer_kind_name(k) << ": a namespace of its own";
  }
  const auto plain = parse_experiment(toml + "[model.draft]\nmode = \"packed\"\nlayers = 2\n", "x", {"topology.tp=2", "topology.pp=2"});
  const ModelGeometry pg = ModelGeometry::draft_for_rank(plain, at, shape);
  EXPECT_EQ(unified_draft_component_plan(plain, pg, LayerKind::Full).digest, unified_draft_plan(plain, pg).digest);
  EXPECT_TRUE(unified_draft_component_plan(plain, pg, LayerKind::Swa).chunks.empty());
}

// P/D transfer tags: one per request in flight and per layer or sidecar, under MPI's bound.
TEST(ExperimentConfig, PdTransferTagsCountSidecars) {
  const std::string pd =
      "[topology.prefill]\ntp = 1\n[topology.decode]\ntp = 1\n[model]\nlayers = 8\nlayer_types = \"full,swa\"\n"
      "swa_window = 16\n[workload]\nkind = \"gsp\"\n";
  const std::string sidecars = "[[model.sidecar]]\nname = \"a\"\nsource = \"full\"\nwords = 1\n"
                               "[[model.sidecar]]\nname = \"b\"\nsource = \"swa\"\nwords = 1\n";
  EXPECT_EQ(error_of(pd, {"engine.max_running=3001"}), "");  // 3001 x 8 tags
  expect_contains(error_of(pd + sidecars, {"engine.max_running=3001"}),
                  "engine.max_running × (model.layers + draft layers + sidecars) = 30010 exceeds the 30000 P/D transfer tags");
  EXPECT_EQ(error_of(pd + sidecars, {"engine.max_running=3000"}), "");
}

}  // namespace
}  // namespace kvgrid
