// Speculative decoding with HiCache under MPI ([model.draft]): a multi-turn history that outgrows
// the device and host tiers, for every TP × PP layout the world allows, with host and storage
// failpoints and aborts. packed and sidecar restore the draft's KV with the target's, so every
// draft round is verified intact and the acceptance is exactly the HiCache-off run's (request by
// request: the draws are seeded per position); target_only restores the target alone, so its
// drafts read blind prefixes (checksum mismatches) and accept less. The target's oracle is OK in
// all of them, ranks agree, and the same seed gives the same acceptance.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>

#include "core/decision_log.hpp"
#include "layouts.hpp"
#include "mpi_util.hpp"
#include "runtime/experiment.hpp"
#include "runtime/serve.hpp"
#include "serve_util.hpp"

namespace kvgrid {
namespace {

using testing::serve;

ExperimentConfig history(int tp, int pp, const std::string& dir, std::vector<std::string> extra, std::int64_t seed = 3) {
  std::vector<std::string> sets = {"topology.tp=" + std::to_string(tp), "topology.pp=" + std::to_string(pp),
                                   "model.layers=4", "model.kv_heads=4", "model.head_dim=4", "cache.page_size=4",
                                   "cache.device_pages=70", "cache.host_pages=90", "cache.load_back_threshold=8",
                                   "cache.storage=file", "cache.storage_dir=" + dir, "cache.prefetch_threshold=8",
                                   "cache.prefetch_policy=wait_complete", "workload.kind=multiturn",
                                   "workload.multiturn.clients=6", "workload.multiturn.rounds=4",
                                   "workload.multiturn.request_length=40", "workload.multiturn.output_length=12",
                                   "workload.multiturn.sub_question_length=8", "workload.multiturn.max_in_flight=3",
                                   "workload.multiturn.round_barrier=true", "engine.chunk_size=32", "engine.check_every=5",
                                   "engine.payload=full", "model.draft.steps=3", "model.draft.accept_prob=0.7"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return parse_experiment("", "spec-draft-test", sets, seed);
}

// (tp, pp) filling the world: TP must divide the 4 heads, every stage needs one of the 4 layers.
// Suite time: at 8 ranks the first (TP2 x PP4) only; jobs/mpi_seeds.sh runs TP4 x PP2 too.
std::vector<std::array<int, 2>> layouts() {
  const int n = testing::world_size();
  std::vector<std::array<int, 2>> out;
  for (int tp : {1, 2, 4})
    if (n % tp == 0 && n / tp <= 4) out.push_back({tp, n / tp});
  if (n > 4 && testing::in_suite() && out.size() > 1) out.resize(1);
  return out;
}

const std::vector<std::string> kFaults = {
    "faults.transfer.fail.probability=0.05",      "faults.transfer.delay.probability=0.1",
    "faults.host.alloc.fail.probability=0.03",    "faults.storage.read.fail.probability=0.1",
    "faults.storage.object.corrupt.probability=0.05", "faults.storage.write.fail.probability=0.05",
    "faults.storage.read.slow.probability=0.1",   "faults.p2p.delay.probability=0.05"};

// A hybrid target (FULL + SWA + MAMBA) and a hybrid draft (its SWA pages and states at the
// target's ids) at the device tier: verify steps of several tokens move SWA windows and pass MAMBA
// checkpoint depths mid-step; no draft checksum mismatch; the history is reused, oracle OK, ranks
// agreeing, under device allocation failures, aborts and link delays; the #21 variant under
// multi-token acceptance (cache.component_bugs = mtp_state_at_floor) is caught by the oracle.
TEST(SpecDraft, HybridTargetsVerifySeveralTokensAStepThroughWindowsAndCheckpoints) {
  const std::vector<std::string> hybrid = {"model.layers=8", "model.layer_types=full,swa,full,mamba", "model.swa_window=10", "model.mamba_chunk=8",
                                           "model.mamba_state=2", "cache.host_pages=0", "cache.storage=none",
                                           "cache.device_pages=120", "cache.swa_pages=60", "cache.mamba_slots=24",
                                           "model.draft.mode=packed", "model.draft.layers=3",
                                           "model.draft.layer_types=full,swa,mamba"};
  for (const auto& [tp, pp] : layouts()) {
    SCOPED_TRACE("TP" + std::to_string(tp) + " PP" + std::to_string(pp));
    for (std::int64_t seed = 3; seed < 3 + testing::suite_seeds(2); ++seed) {
      auto sets = hybrid;
      for (const char* f : {"faults.device.alloc.fail.probability=0.1", "faults.request.abort.probability=0.03",
                            "faults.p2p.delay.probability=0.1"})
        sets.push_back(f);
      DecisionLog log;
      auto r = serve(history(tp, pp, "", sets, seed), log);
      EXPECT_EQ(r.oracle_mismatches, 0) << "seed " << seed;
      EXPECT_EQ(r.divergences(), 0);
      EXPECT_EQ(r.verify_failures, 0);
      EXPECT_EQ(r.draft_mismatches, 0);
      EXPECT_GT(r.spec_accepted, 0);
      EXPECT_GT(r.cached_tokens, 0) << "the history is reused";
    }
    auto bug = hybrid;
    bug.push_back("cache.component_bugs=mtp_state_at_floor");
    DecisionLog log;
    auto b = serve(history(tp, pp, "", bug), log);
    EXPECT_GT(b.oracle_mismatches, 0) << "mtp_state_at_floor: a verify step's final state registered at the depth it passed";
  }
}

// A hybrid target and draft with the host tier (and storage): the draft's FULL pages,
// SWA pages and states move with the target's copies, so packed and sidecar accept exactly what the
// HiCache-off run accepts, request by request, with no draft mismatch — through storage objects too
// (packed: inside the target's bytes; sidecar: after them), and under transfer.fail,
// transfer.delay and host.alloc.fail —, while target_only leaves restored drafts blind.
TEST(SpecDraft, HybridDraftsMoveWithTheHostTier) {
  const std::vector<std::string> hybrid = {
      "model.layers=8", "model.layer_types=full,swa,full,mamba", "model.swa_window=10", "model.mamba_chunk=8",
      "model.mamba_state=2", "model.draft.layers=3", "model.draft.layer_types=full,swa,mamba", "cache.device_pages=70",
      "cache.swa_pages=40", "cache.mamba_slots=12", "cache.host_swa_pages=60", "cache.host_mamba_slots=24"};
  const auto all = layouts();
  for (std::size_t li = 0; li < all.size(); ++li) {
    const auto [tp, pp] = all[li];
    SCOPED_TRACE("TP" + std::to_string(tp) + " PP" + std::to_string(pp));
    // (PP4: the last stage — layers 6 and 7, full and mamba — holds no target SWA layer, so the
    // draft's SWA host copies live in a pool of their own, packed or not)
    auto off_sets = hybrid;
    for (const char* s : {"model.draft.mode=packed", "cache.host_pages=0", "cache.storage=none", "cache.device_pages=400",
                          "cache.swa_pages=200", "cache.mamba_slots=60"})
      off_sets.push_back(s);
    DecisionLog off_log;
    auto off = serve(history(tp, pp, "", off_sets), off_log);
    ASSERT_EQ(off.oracle_mismatches, 0);
    ASSERT_EQ(off.draft_mismatches, 0);
    const char* modes[] = {"packed", "sidecar", "target_only", "packed+storage", "sidecar+storage", "packed+faults", "sidecar+unified"};
    for (std::size_t mi = 0; mi < std::size(modes); ++mi) {
      // (suite time: with several layouts, each mode at one of them, in turn; jobs/mpi_seeds.sh runs all)
      if (testing::in_suite() && mi % all.size() != li) continue;
      const char* mode = modes[mi];
      SCOPED_TRACE(mode);
      auto sets = hybrid;
      const std::string m(mode);
      sets.push_back("model.draft.mode=" + m.substr(0, m.find('+')));
      if (m.find("+storage") == std::string::npos && m.find("+unified") == std::string::npos) sets.push_back("cache.storage=none");
      if (m.find("+unified") != std::string::npos)  // the draft's kinds as objects of their own namespaces
        for (const char* u : {"cache.storage_key_scheme=unified", "cache.storage_layer_partition=2", "cache.storage_head_partition=1"})
          sets.push_back(u);
      if (m.find("+faults") != std::string::npos)
        for (const char* f : {"faults.transfer.fail.probability=0.05", "faults.transfer.delay.probability=0.1",
                              "faults.host.alloc.fail.probability=0.03"})
          sets.push_back(f);
      DecisionLog log;
      auto r = serve(history(tp, pp, testing::shared_temp_dir(std::string("hspec-") + std::to_string(tp) + "x" + std::to_string(pp) +
                                                                  "-" + std::to_string(mi)),
                             sets),
                     log);
      EXPECT_EQ(r.oracle_mismatches, 0);
      EXPECT_EQ(r.divergences(), 0);
      EXPECT_EQ(r.verify_failures, 0);
      EXPECT_GT(r.host_tokens + r.storage_tokens, 0) << "the history comes back from the host (and storage)";
      if (m.find("+storage") != std::string::npos || m.find("+unified") != std::string::npos) {
        EXPECT_GT(r.storage_tokens, 0) << "and from the storage objects, the draft's with the target's";
      }
      if (m == "target_only") {
        EXPECT_GT(r.draft_mismatches, 0) << "restored prefixes leave the draft blind";
      } else {
        EXPECT_EQ(r.draft_mismatches, 0);
        EXPECT_EQ(r.spec_digest, off.spec_digest) << "request by request, the acceptance of the run without host copies";
      }
      if (testing::world_rank() == 0)
        std::printf("[ hybrid spec ] TP%dxPP%d %-14s: %lld/%lld accepted, %lld draft mismatches, host %lld storage %lld tokens\n", tp, pp,
                    mode, static_cast<long long>(r.spec_accepted), static_cast<long long>(r.spec_proposed),
                    static_cast<long long>(r.draft_mismatches), static_cast<long long>(r.host_tokens),
                    static_cast<long long>(r.storage_tokens));
    }
  }
}

TEST(SpecDraft, PackedAndSidecarKeepTheAcceptanceOfHiCacheOffWhileTargetOnlyCollapses) {
  for (const auto& [tp, pp] : layouts()) {
    SCOPED_TRACE("TP" + std::to_string(tp) + " PP" + std::to_string(pp));
    const std::string tag = "TP" + std::to_string(tp) + "xPP" + std::to_string(pp);
    DecisionLog off_log;
    auto off = serve(history(tp, pp, testing::shared_temp_dir("spec-off"),
                             {"model.draft.mode=packed", "cache.host_pages=0", "cache.storage=none"}),
                     off_log);
    ASSERT_EQ(off.oracle_mismatches, 0);
    ASSERT_GT(off.spec_rounds, 0);
    EXPECT_EQ(off.draft_mismatches, 0);
    EXPECT_GT(off.spec_accepted, 0);
    EXPECT_LT(off.spec_accepted, off.spec_proposed);
    for (const char* mode : {"packed", "sidecar", "target_only"}) {
      SCOPED_TRACE(mode);
      DecisionLog log;
      auto r = serve(history(tp, pp, testing::shared_temp_dir(std::string("spec-") + mode), {std::string("model.draft.mode=") + mode}), log);
      EXPECT_EQ(r.oracle_mismatches, 0);  // the target's KV is right in every mode
      EXPECT_EQ(r.divergences(), 0);
      EXPECT_EQ(r.verify_failures, 0);
      EXPECT_EQ(r.finished, off.finished);
      EXPECT_GT(r.cached_tokens, r.prompt_tokens / 4) << "the history is restored from the tiers";
      if (std::string(mode) == "target_only") {
        EXPECT_GT(r.draft_mismatches, 0) << "restored prefixes leave the draft blind";
        // tokens per verify step: about 1 + p + p² + p³ = 2.5 when the draft reads the right KV
        auto length = [](const ServeResult& x) {
          return static_cast<double>(x.spec_accepted + x.spec_rounds) / static_cast<double>(x.spec_rounds);
        };
        EXPECT_LT(length(r), length(off) - 0.5);
      } else {
        EXPECT_EQ(r.draft_mismatches, 0);
        EXPECT_EQ(r.spec_rounds, off.spec_rounds);
        EXPECT_EQ(r.spec_accepted, off.spec_accepted);
        EXPECT_EQ(r.spec_digest, off.spec_digest);  // request by request
      }
      if (testing::world_rank() == 0)
        std::printf("[ spec draft ] %s %-11s: %lld rounds, %lld/%lld accepted, %lld draft mismatches, hit %.2f\n",
                    tag.c_str(), mode, static_cast<long long>(r.spec_rounds), static_cast<long long>(r.spec_accepted),
                    static_cast<long long>(r.spec_proposed), static_cast<long long>(r.draft_mismatches),
                    static_cast<double>(r.cached_tokens) / static_cast<double>(r.prompt_tokens));
    }
  }
}

// A draft over a CP-sharded pool (CP2 × PP2 and MLA TP2 × PP2, sharded over TP, at 4 ranks;
// TP2 × CP2 × PP2 at 8): the draft's pages carry the target's owners and its cached prefix is read
// through its own layer gather, so packed and sidecar accept exactly what the HiCache-off run
// accepts (request by request) with no draft mismatch, also under host/storage faults and aborts;
// target_only leaves restored drafts blind.
TEST(SpecDraft, DraftsOverCpShardedPoolsGatherTheirOwnPrefix) {
  struct Layout {
    int tp, cp;
    std::string attention;
  };
  std::vector<Layout> layouts;
  if (testing::world_size() == 4) layouts = {{1, 2, "mha"}, {2, 1, "mla"}};
  if (testing::world_size() == 8) layouts = {{2, 2, "mha"}};
  if (layouts.empty()) GTEST_SKIP() << "sharded layouts are listed for 4 and 8 ranks";
  for (const auto& [tp, cp, attention] : layouts) {
    const std::string tag = attention + " TP" + std::to_string(tp) + "xCP" + std::to_string(cp) + "xPP2";
    SCOPED_TRACE(tag);
    auto sharded = [&](const std::string& dir, std::vector<std::string> extra, std::int64_t seed = 3) {
      extra.insert(extra.end(), {"topology.cp=" + std::to_string(cp), "model.attention=" + attention, "cache.gather_pages=64",
                                 "cache.device_pages=110"});
      return history(tp, 2, testing::shared_temp_dir(dir), extra, seed);
    };
    DecisionLog off_log;
    auto off = serve(sharded("spec-cp-off", {"model.draft.mode=packed", "cache.host_pages=0", "cache.storage=none"}), off_log);
    ASSERT_EQ(off.oracle_mismatches, 0);
    ASSERT_GT(off.spec_rounds, 0);
    EXPECT_EQ(off.draft_mismatches, 0);
    for (const char* mode : {"packed", "sidecar", "target_only"}) {
      SCOPED_TRACE(mode);
      DecisionLog log;
      auto r = serve(sharded(std::string("spec-cp-") + mode, {std::string("model.draft.mode=") + mode, "cache.cp_sharding=sharded"}), log);
      EXPECT_EQ(r.oracle_mismatches, 0);
      EXPECT_EQ(r.divergences(), 0);
      EXPECT_EQ(r.verify_failures, 0);
      EXPECT_GT(r.cached_tokens, r.prompt_tokens / 4) << "the history is restored from the tiers";
      if (std::string(mode) == "target_only") {
        EXPECT_GT(r.draft_mismatches, 0) << "restored prefixes leave the draft blind";
      } else {
        EXPECT_EQ(r.draft_mismatches, 0);
        EXPECT_EQ(r.spec_rounds, off.spec_rounds);
        EXPECT_EQ(r.spec_accepted, off.spec_accepted);
        EXPECT_EQ(r.spec_digest, off.spec_digest);
      }
      if (testing::world_rank() == 0)
        std::printf("[ spec draft ] sharded %s %-11s: %lld rounds, %lld/%lld accepted, %lld draft mismatches\n", tag.c_str(), mode,
                    static_cast<long long>(r.spec_rounds), static_cast<long long>(r.spec_accepted),
                    static_cast<long long>(r.spec_proposed), static_cast<long long>(r.draft_mismatches));
    }
    std::vector<std::string> sets = kFaults;
    sets.insert(sets.end(), {"model.draft.mode=sidecar", "cache.cp_sharding=sharded", "faults.request.abort.probability=0.02"});
    DecisionLog log;
    auto r = serve(sharded("spec-cp-faults", sets, 11), log);
    EXPECT_EQ(r.oracle_mismatches, 0);
    EXPECT_EQ(r.divergences(), 0);
    EXPECT_EQ(r.verify_failures, 0);
    EXPECT_EQ(r.draft_mismatches, 0);
    EXPECT_GT(r.spec_accepted, 0);
  }
}

TEST(SpecDraft, DraftStateSurvivesFaultsAndAborts) {
  for (const auto& [tp, pp] : layouts()) {
    for (const char* mode : {"packed", "sidecar"}) {
      SCOPED_TRACE("TP" + std::to_string(tp) + " PP" + std::to_string(pp) + " " + mode);
      std::vector<std::string> sets = kFaults;
      sets.push_back(std::string("model.draft.mode=") + mode);
      sets.push_back("faults.request.abort.probability=0.02");
      DecisionLog log;
      auto r = serve(history(tp, pp, testing::shared_temp_dir("spec-faults"), sets, 11), log);
      EXPECT_EQ(r.oracle_mismatches, 0);
      EXPECT_EQ(r.divergences(), 0);
      EXPECT_EQ(r.verify_failures, 0);
      EXPECT_EQ(r.draft_mismatches, 0) << "a failed or partial copy never leaves a draft page half restored";
      EXPECT_GT(r.spec_accepted, 0);
    }
  }
}

TEST(SpecDraft, AcceptanceIsReproducibleFromTheSeed) {
  const auto [tp, pp] = layouts().back();
  std::uint64_t digest[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    DecisionLog log;
    auto r = serve(history(tp, pp, testing::shared_temp_dir("spec-seed"), {"model.draft.mode=sidecar"}, i < 2 ? 5 : 6), log);
    EXPECT_EQ(r.oracle_mismatches, 0);
    digest[i] = r.spec_digest;
  }
  EXPECT_EQ(digest[0], digest[1]);
  EXPECT_NE(digest[0], digest[2]);
}

}  // namespace
}  // namespace kvgrid
