// P/D disaggregation under MPI: the world split into a prefill and a decode group of equal shape
// (every TP × PP layout that fits half the world), a multi-turn GSP workload with host tiers on
// both sides (and storage under faults). decode_reuse sends each request's prompt minus decode_prefix_len, exactly what the
// decode ranks receive, and much less than full_transfer, which sends every prompt whole; both
// oracle OK and agreed. With pd.transfer.fail, host/copy/link/storage faults and stage skew, broken
// transfers fail exactly their requests (never decoded: the oracle stays OK), the rest finish,
// and every page is released (verify). Broken restores (pd.restore.fail) fail exactly their
// requests, and the unchecked variant is caught by the oracle. The same seed gives the same run.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>

#include "core/check.hpp"
#include "core/decision_log.hpp"
#include "layouts.hpp"
#include "mpi_util.hpp"
#include "runtime/experiment.hpp"
#include "runtime/serve.hpp"
#include "serve_util.hpp"

namespace kvgrid {
namespace {

using testing::serve;

// `toml`: the [topology.prefill] and [topology.decode] tables.
ExperimentConfig pd_world_of(const std::string& toml, std::vector<std::string> extra, std::int64_t seed) {
  std::vector<std::string> sets = {"model.layers=4", "model.kv_heads=4", "model.head_dim=4", "cache.page_size=4",
                                   "cache.device_pages=120", "cache.host_pages=400", "cache.load_back_threshold=8",
                                   "workload.kind=gsp", "workload.gsp.groups=3", "workload.gsp.prompts_per_group=3",
                                   "workload.gsp.system_prompt_len=40", "workload.gsp.question_len=10",
                                   "workload.gsp.output_len=5", "workload.gsp.turns=3", "workload.request_rate=200",
                                   "engine.chunk_size=32", "engine.max_running=6", "engine.check_every=5",
                                   "engine.payload=full"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return parse_experiment(toml, "pd-test", sets, seed);
}

ExperimentConfig pd_world(int tp, int pp, std::vector<std::string> extra, std::int64_t seed = 4, const std::string& more = "") {
  const std::string g = "tp = " + std::to_string(tp) + "\npp = " + std::to_string(pp) + "\n";
  return pd_world_of("[topology.prefill]\n" + g + "[topology.decode]\n" + g + more, std::move(extra), seed);
}

std::vector<std::array<int, 2>> layouts() {
  const int n = testing::world_size();
  std::vector<std::array<int, 2>> out;
  if (n % 2 != 0) return out;
  for (int tp : {1, 2, 4})
    if ((n / 2) % tp == 0 && (n / 2) / tp <= 4) out.push_back({tp, n / 2 / tp});
  return out;
}

TEST(Pd, DecodeReuseSendsOnlyTheSuffixDecodeDoesNotHold) {
  if (layouts().empty()) GTEST_SKIP() << "needs an even world";
  for (const auto& [tp, pp] : layouts()) {
    SCOPED_TRACE("prefill and decode TP" + std::to_string(tp) + " PP" + std::to_string(pp));
    DecisionLog reuse_log, full_log;
    auto reuse = serve(pd_world(tp, pp, {"protocol.pd=decode_reuse"}), reuse_log);
    auto full = serve(pd_world(tp, pp, {"protocol.pd=full_transfer"}), full_log);
    for (const auto* r : {&reuse, &full}) {
      EXPECT_EQ(r->oracle_mismatches, 0);  // decode computed on exactly the KV prefill computed
      EXPECT_EQ(r->divergences(), 0);
      EXPECT_EQ(r->verify_failures, 0);
      EXPECT_EQ(r->pd_failed, 0);
      EXPECT_EQ(r->pd_sent_tokens, r->pd_received_tokens) << "counted at the send and at the receive";
    }
    // full_transfer: every prompt whole; decode_reuse: what decode's own cache did not hold.
    EXPECT_EQ(full.pd_sent_tokens, full.prompt_tokens);
    EXPECT_GT(reuse.pd_sent_tokens, 0);
    EXPECT_LT(reuse.pd_sent_tokens * 2, full.pd_sent_tokens);
    if (testing::world_rank() == 0)
      std::printf("[ pd ] TP%d PP%d: %lld prompt tokens, sent %lld (decode_reuse) vs %lld (full_transfer)\n", tp, pp,
                  static_cast<long long>(full.prompt_tokens), static_cast<long long>(reuse.pd_sent_tokens),
                  static_cast<long long>(full.pd_sent_tokens));
  }
}

TEST(Pd, BrokenTransfersFailExactlyTheirRequestsUnderFaults) {
  if (layouts().empty()) GTEST_SKIP() << "needs an even world";
  for (const auto& [tp, pp] : layouts()) {
    SCOPED_TRACE("TP" + std::to_string(tp) + " PP" + std::to_string(pp));
    DecisionLog log;
    auto r = serve(pd_world(tp, pp, {"faults.pd.transfer.fail.probability=0.15", "faults.transfer.fail.probability=0.1",
                                     "faults.transfer.delay.probability=0.2", "faults.p2p.delay.probability=0.1",
                                     "faults.host.alloc.fail.probability=0.05", "faults.device.alloc.fail.probability=0.1",
                                     "faults.storage.read.fail.probability=0.1",
                                     "faults.storage.object.corrupt.probability=0.05", "cost.stage_skew=0.5",
                                     "cache.storage=file", "cache.storage_dir=" + testing::shared_temp_dir("pd-storage"),
                                     "cache.host_pages=150", "cache.prefetch_threshold=8"},
                           9),
                   log);
    EXPECT_EQ(r.oracle_mismatches, 0) << "a request was decoded on a broken transfer";
    EXPECT_EQ(r.divergences(), 0);
    EXPECT_EQ(r.verify_failures, 0) << "pages held by a failed request leaked";
    EXPECT_GT(r.pd_failed, 0);
    EXPECT_EQ(r.pd_sent_tokens, r.pd_received_tokens);
  }
}

// Hybrid models (FULL + SWA + MAMBA) at the device tier: decode_prefix_len is decode's hybrid
// match; the suffix's FULL pages, the prompt's tail window of SWA pages and the state at its end
// arrive intact (oracle OK) — with the two sidecars' words of the FULL and SWA pages sent — under
// broken transfers, device allocation failures, link delays,
// aborts and stage skew; full_transfer sends every prompt whole; with decode's host tier restores
// of every component — at one stage broken ones agreed and taken back inside the admission, across
// stages private until agreed, a broken one failing its request.
TEST(Pd, HybridModelsReceiveTheSuffixTheTailWindowAndTheStateUnderFaults) {
  if (layouts().empty()) GTEST_SKIP() << "needs an even world";
  const std::vector<std::string> hybrid = {"model.layers=8", "model.layer_types=full,swa,full,mamba", "model.swa_window=10", "model.mamba_chunk=8",
                                           "model.mamba_state=2", "cache.host_pages=0", "cache.swa_pages=60",
                                           "cache.mamba_slots=24", "workload.gsp.output_len=9"};
  std::int64_t restored = 0;
  for (const auto& [tp, pp] : layouts())
    for (const char* pd : {"decode_reuse", "full_transfer", "decode_reuse+host"})
      for (std::int64_t seed = 21; seed < 21 + testing::suite_seeds(2); ++seed) {
        const bool host = std::string(pd) == "decode_reuse+host";
        SCOPED_TRACE("TP" + std::to_string(tp) + " PP" + std::to_string(pp) + " " + pd + " seed " + std::to_string(seed));
        auto sets = hybrid;
        if (host) {  // decode restores from its host tier, and some restores break (taken back: the suffix grows)
          for (const char* s : {"cache.host_pages=400", "cache.host_swa_pages=200", "cache.host_mamba_slots=60",
                                "cache.device_pages=60", "faults.pd.restore.fail.probability=0.2",
                                "faults.transfer.fail.probability=0.05"})
            sets.push_back(s);
          pd = "decode_reuse";
        }
        for (const char* f : {"faults.pd.transfer.fail.probability=0.1", "faults.device.alloc.fail.probability=0.1",
                              "faults.p2p.delay.probability=0.1", "faults.request.abort.probability=0.03", "cost.stage_skew=0.5"})
          sets.push_back(f);
        sets.push_back(std::string("protocol.pd=") + pd);
        DecisionLog log;
        const std::string sidecars =
            "[[model.sidecar]]\nname = \"indexer\"\nsource = \"full\"\nwords = 2\n"
            "[[model.sidecar]]\nname = \"compressor\"\nsource = \"swa\"\nwords = 1\n";
        auto r = serve(pd_world(tp, pp, sets, seed, sidecars), log);
        EXPECT_EQ(r.oracle_mismatches, 0) << "a window page, a state or a sidecar's words arrived wrong, or a broken transfer was decoded";
        EXPECT_EQ(r.divergences(), 0);
        EXPECT_EQ(r.verify_failures, 0);
        EXPECT_EQ(r.pd_sent_tokens, r.pd_received_tokens);
        EXPECT_GT(r.finished, 0);
        if (std::string(pd) == "decode_reuse") {
          EXPECT_LT(r.pd_sent_tokens, r.prompt_tokens) << "decode reused its own history";
        }
        if (host) restored += r.host_tokens;
      }
  // (How much decode restores depends on the layout's pressure; the CLI test hybrid_pd asserts a
  // decode restore of every component exactly: Figure 5's request 3.)
  if (testing::world_rank() == testing::world_size() - 1)
    std::printf("[ pd hybrid ] host tokens restored on this decode rank: %lld\n", static_cast<long long>(restored));
}

TEST(Pd, AbortsReleaseTheRequestOnBothSidesMidTransfer) {
  if (layouts().empty()) GTEST_SKIP() << "needs an even world";
  for (const auto& [tp, pp] : layouts()) {
    SCOPED_TRACE("TP" + std::to_string(tp) + " PP" + std::to_string(pp));
    DecisionLog log;
    auto r = serve(pd_world(tp, pp, {"faults.request.abort.probability=0.08", "faults.pd.transfer.fail.probability=0.1"}, 12),
                   log);
    EXPECT_EQ(r.oracle_mismatches, 0);
    EXPECT_EQ(r.divergences(), 0);
    EXPECT_EQ(r.verify_failures, 0) << "an aborted request's pages or receives leaked";
    // Prefill's first rank counts its aborts; decode's failures (the run's, on every rank) are
    // those aborts plus the broken transfers.
    std::int64_t aborts = testing::world_rank() == 0 ? r.aborted_prefetching + r.aborted_other : 0;
    MPI_Allreduce(MPI_IN_PLACE, &aborts, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_GT(aborts, 0) << "no request was aborted";
    EXPECT_EQ(r.failed, aborts + r.pd_failed) << "decode released a different set of requests";
    EXPECT_EQ(r.finished + r.failed, r.requests) << "every request finished or failed once";
    EXPECT_EQ(r.pd_sent_tokens, r.pd_received_tokens);
  }
}

// pd.restore.fail on each decode rank independently (one TP rank's copy may fail alone): the
// outcome is agreed over decode's ranks, so exactly the requests whose restore broke somewhere
// fail — on every rank, never decoded, their restored pages never published and all released.
// The buggy variant (restores published at once, never checked) decodes on the broken KV.
TEST(Pd, BrokenRestoresFailExactlyTheirRequestsAndReleaseTheirPages) {
  if (layouts().empty()) GTEST_SKIP() << "needs an even world";
  const std::vector<std::string> faults = {"faults.pd.restore.fail.probability=0.3", "faults.transfer.delay.probability=0.2",
                                           "cost.stage_skew=0.5", "cache.device_pages=40"};
  for (const auto& [tp, pp] : layouts()) {
    SCOPED_TRACE("TP" + std::to_string(tp) + " PP" + std::to_string(pp));
    DecisionLog log;
    auto r = serve(pd_world(tp, pp, faults, 5), log);
    EXPECT_EQ(r.oracle_mismatches, 0) << "a request was decoded on a broken restore";
    EXPECT_EQ(r.divergences(), 0);
    EXPECT_EQ(r.verify_failures, 0) << "pages held by a failed request leaked";
    EXPECT_GT(r.pd_restore_failed, 0);
    EXPECT_EQ(r.pd_failed, 0);
    EXPECT_EQ(r.pd_sent_tokens, r.pd_received_tokens);
    // Decode failed exactly its broken restores; everything else finished.
    EXPECT_EQ(r.failed, r.pd_restore_failed);
    EXPECT_EQ(r.finished + r.failed, r.requests);
    if (testing::world_rank() == testing::world_size() / 2)
      std::printf("[ pd ] TP%d PP%d: %lld requests failed on a broken restore of %lld (%lld pages restored)\n", tp, pp,
                  static_cast<long long>(r.pd_restore_failed), static_cast<long long>(r.requests),
                  static_cast<long long>(r.mine.h2d_pages));
    std::vector<std::string> buggy = faults;
    buggy.push_back("protocol.pd_restore=unchecked");
    DecisionLog blog;
    auto b = serve(pd_world(tp, pp, buggy, 5), blog);
    EXPECT_GT(b.oracle_mismatches, 0) << "unchecked restores must be caught by the oracle";
    EXPECT_EQ(b.pd_restore_failed, 0);
  }
}

// Heterogeneous layouts (the groups' TP, CP and PP differ): each decode rank receives its layers
// and heads from the prefill ranks holding them (runtime/pd.hpp PdLeg); the oracle checks every
// decoded request, so a wrong head or layer mapping fails here. With broken transfers and
// restores, exactly those requests fail.
TEST(Pd, HeterogeneousLayoutsTransferEachLayerAndHeadFromItsHolder) {
  std::vector<std::pair<std::string, std::string>> pairs;  // prefill, decode: [topology.*] bodies
  if (testing::world_size() == 4)
    pairs = {{"tp = 2\n", "pp = 2\n"}, {"tp = 1\n", "pp = 3\n"}, {"pp = 2\n", "tp = 2\n"}};
  if (testing::world_size() == 8)
    pairs = {{"tp = 2\npp = 2\n", "tp = 4\n"}, {"tp = 4\n", "tp = 2\npp = 2\n"}, {"tp = 2\ncp = 2\n", "tp = 1\npp = 2\ncp = 2\n"}};
  if (pairs.empty()) GTEST_SKIP() << "heterogeneous pairs are listed for 4 and 8 ranks";
  for (const auto& [pre, dec] : pairs) {
    const std::string toml = "[topology.prefill]\n" + pre + "[topology.decode]\n" + dec;
    SCOPED_TRACE(toml);
    auto make = [&](std::vector<std::string> extra) { return pd_world_of(toml, std::move(extra), 7); };
    DecisionLog a, b;
    auto reuse = serve(make({"cache.device_pages=60"}), a);
    EXPECT_EQ(reuse.oracle_mismatches, 0) << "decode computed on KV other than prefill's";
    EXPECT_EQ(reuse.divergences(), 0);
    EXPECT_EQ(reuse.verify_failures, 0);
    EXPECT_EQ(reuse.pd_sent_tokens, reuse.pd_received_tokens);
    EXPECT_GT(reuse.pd_sent_tokens, 0);
    EXPECT_LT(reuse.pd_sent_tokens * 2, reuse.prompt_tokens) << "decode reuse still sends only suffixes";
    auto faulty = serve(make({"cache.device_pages=40", "faults.pd.transfer.fail.probability=0.1",
                              "faults.pd.restore.fail.probability=0.2"}),
                        b);
    EXPECT_EQ(faulty.oracle_mismatches, 0);
    EXPECT_EQ(faulty.divergences(), 0);
    EXPECT_EQ(faulty.verify_failures, 0);
    EXPECT_GT(faulty.pd_failed + faulty.pd_restore_failed, 0);
    auto flat = [](std::string t) {
      std::replace(t.begin(), t.end(), '\n', ' ');
      return t;
    };
    if (testing::world_rank() == 0)
      std::printf("[ pd ] prefill {%s} decode {%s}: sent %lld of %lld prompt tokens; under faults %lld + %lld failed\n",
                  flat(pre).c_str(), flat(dec).c_str(), static_cast<long long>(reuse.pd_sent_tokens),
                  static_cast<long long>(reuse.prompt_tokens), static_cast<long long>(faulty.pd_failed),
                  static_cast<long long>(faulty.pd_restore_failed));
  }
}

// CP-sharded pools on both sides, equal or different shard groups (CP sizes, TP, PP, and for MLA
// a TP shard group on one side and a CP one on the other): each page goes from its owner on
// prefill to its owner on decode (pd_legs), and decode's first step reads the whole received
// prompt (its last page partial) through the layer gather. The sharded world sends exactly the
// replicated world's suffixes (the same cache decisions), oracle OK, also under broken transfers
// and restores; restoring onto any free page is caught by the oracle.
TEST(Pd, ShardedPoolsSendEachPageFromOwnerToOwner) {
  struct Layout {
    std::string prefill, decode, attention;
    bool decode_sharded = true;  // any_owner_restore acts on decode's restores (prefill's pool is not under pressure)
  };
  std::vector<Layout> layouts;
  if (testing::world_size() == 4) layouts = {{"cp = 3\n", "tp = 1\n", "mha", false}, {"tp = 2\n", "cp = 2\n", "mla"}};
  if (testing::world_size() == 8) layouts = {{"cp = 2\npp = 2\n", "cp = 2\npp = 2\n", "mha"}, {"cp = 4\n", "tp = 2\ncp = 2\n", "mha"}};
  if (layouts.empty()) GTEST_SKIP() << "sharded layouts are listed for 4 and 8 ranks";
  for (const auto& [pg, dg, attention, decode_sharded] : layouts) {
    const std::string toml = "[topology.prefill]\n" + pg + "[topology.decode]\n" + dg;
    const std::string g = attention + " prefill {" + pg + "} decode {" + dg + "}";
    SCOPED_TRACE(toml + attention);
    auto with = [&](std::vector<std::string> extra) {
      extra.push_back("cache.gather_pages=32");
      extra.push_back("model.attention=" + attention);
      return pd_world_of(toml, std::move(extra), 8);
    };
    DecisionLog a, b, c, d;
    auto rep = serve(with({"cache.cp_sharding=replicated", "cache.device_pages=200"}), a);
    auto sh = serve(with({"cache.cp_sharding=sharded", "cache.device_pages=200"}), b);
    for (const auto* r : {&rep, &sh}) {
      EXPECT_EQ(r->oracle_mismatches, 0) << (r == &rep ? "replicated" : "sharded");
      EXPECT_EQ(r->divergences(), 0);
      EXPECT_EQ(r->verify_failures, 0);
      EXPECT_EQ(r->pd_sent_tokens, r->pd_received_tokens);
      EXPECT_EQ(r->finished, r->requests);
    }
    EXPECT_EQ(sh.pd_sent_tokens, rep.pd_sent_tokens) << "sharding changes where pages live, not what decode reuses";
    EXPECT_LT(sh.pd_sent_tokens * 2, sh.prompt_tokens);
    auto faulty = serve(with({"cache.cp_sharding=sharded", "cache.device_pages=60", "faults.pd.restore.fail.probability=0.2",
                              "faults.pd.transfer.fail.probability=0.1"}),
                        c);
    EXPECT_EQ(faulty.oracle_mismatches, 0);
    EXPECT_EQ(faulty.divergences(), 0);
    EXPECT_EQ(faulty.verify_failures, 0);
    EXPECT_EQ(faulty.failed, faulty.pd_failed + faulty.pd_restore_failed);
    EXPECT_GT(faulty.failed, 0);
    set_debug_checks(false);  // (the owner check on copies would stop the buggy run on one rank)
    auto bug = serve(with({"cache.cp_sharding=any_owner_restore", "cache.device_pages=60"}), d);
    set_debug_checks(true);
    if (decode_sharded) {
      EXPECT_GT(bug.oracle_mismatches, 0) << "restoring onto any free page must be caught";
    }
    if (testing::world_rank() == 0) {
      std::string flat = g;
      std::replace(flat.begin(), flat.end(), '\n', ' ');
      std::printf("[ pd ] sharded {%s}: sent %lld (replicated %lld) of %lld; faults: %lld + %lld failed; any_owner_restore: %lld "
                  "mismatches\n",
                  flat.c_str(), static_cast<long long>(sh.pd_sent_tokens), static_cast<long long>(rep.pd_sent_tokens),
                  static_cast<long long>(sh.prompt_tokens), static_cast<long long>(faulty.pd_failed),
                  static_cast<long long>(faulty.pd_restore_failed), static_cast<long long>(bug.oracle_mismatches));
    }
  }
}

TEST(Pd, SameSeedSameRun) {
  if (layouts().empty()) GTEST_SKIP() << "needs an even world";
  const auto [tp, pp] = layouts().back();
  DecisionLog a, b;
  auto ra = serve(pd_world(tp, pp, {"faults.pd.transfer.fail.probability=0.2"}, 6), a);
  auto rb = serve(pd_world(tp, pp, {"faults.pd.transfer.fail.probability=0.2"}, 6), b);
  EXPECT_EQ(a.running_digest(), b.running_digest());
  EXPECT_EQ(ra.pd_sent_tokens, rb.pd_sent_tokens);
  EXPECT_EQ(ra.pd_failed, rb.pd_failed);
  EXPECT_EQ(ra.model_ns, rb.model_ns);
}

// Speculative decoding in a P/D world: prefill computes the draft's KV over the prompt and sends
// the draft's suffix with the target's (its layers after the target's, last stage to last stage);
// decode reuses the draft's KV from its own tiers like the target's. packed and sidecar accept
// exactly what a run without decode reuse or host tier accepts (every position's draws, request by
// request) with no draft mismatch; target_only sends and restores no draft KV and collapses; broken
// transfers (a break in the draft's layers alone included) and broken restores fail exactly their
// requests, none decoded with a broken draft.
TEST(Pd, SpeculativeDecodingSendsTheDraftsSuffixWithTheTargets) {
  std::string pg, dg;
  if (testing::world_size() == 2) pg = dg = "tp = 1\n";
  if (testing::world_size() == 4) pg = "tp = 2\n", dg = "pp = 2\n";
  if (testing::world_size() == 8) pg = dg = "tp = 2\npp = 2\n";
  if (pg.empty()) GTEST_SKIP() << "layouts are listed for 2, 4 and 8 ranks";
  const std::string toml = "[topology.prefill]\n" + pg + "[topology.decode]\n" + dg;
  SCOPED_TRACE(toml);
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), {"model.draft.steps=3", "model.draft.accept_prob=0.7", "workload.gsp.output_len=12",
                               "cache.device_pages=40"});
    return pd_world_of(toml, std::move(extra), 8);
  };
  DecisionLog off_log;
  auto off = serve(with({"model.draft.mode=sidecar", "protocol.pd=full_transfer", "cache.host_pages=0", "cache.device_pages=200"}), off_log);
  ASSERT_EQ(off.oracle_mismatches, 0);
  ASSERT_GT(off.spec_rounds, 0);
  EXPECT_EQ(off.draft_mismatches, 0);
  for (const char* mode : {"packed", "sidecar", "target_only"}) {
    SCOPED_TRACE(mode);
    DecisionLog log;
    auto r = serve(with({std::string("model.draft.mode=") + mode}), log);
    EXPECT_EQ(r.oracle_mismatches, 0);
    EXPECT_EQ(r.divergences(), 0);
    EXPECT_EQ(r.verify_failures, 0);
    EXPECT_EQ(r.pd_sent_tokens, r.pd_received_tokens);
    EXPECT_LT(r.pd_sent_tokens * 2, r.prompt_tokens) << "decode reuses its own tiers";
    EXPECT_GT(r.host_tokens, 0) << "decode restores from its host tier (the draft's KV with the target's)";
    if (std::string(mode) == "target_only") {
      EXPECT_GT(r.draft_mismatches, 0) << "a draft that gets nothing back is blind";
      EXPECT_LT(r.spec_accepted * 2, off.spec_accepted);
    } else {
      EXPECT_EQ(r.draft_mismatches, 0);
      EXPECT_EQ(r.spec_rounds, off.spec_rounds);
      EXPECT_EQ(r.spec_accepted, off.spec_accepted);
      EXPECT_EQ(r.spec_digest, off.spec_digest) << "request by request";
    }
    if (testing::world_rank() == 0)
      std::printf("[ pd spec ] %-11s: %lld rounds, %lld/%lld accepted (off: %lld), %lld draft mismatches, sent %lld of %lld, "
                  "%lld from decode's host\n", mode,
                  static_cast<long long>(r.spec_rounds), static_cast<long long>(r.spec_accepted),
                  static_cast<long long>(r.spec_proposed), static_cast<long long>(off.spec_accepted),
                  static_cast<long long>(r.draft_mismatches), static_cast<long long>(r.pd_sent_tokens),
                  static_cast<long long>(r.prompt_tokens), static_cast<long long>(r.host_tokens));
  }
  DecisionLog log;
  auto faulty = serve(with({"model.draft.mode=sidecar", "faults.pd.transfer.fail.probability=0.15",
                            "faults.pd.restore.fail.probability=0.2", "faults.transfer.delay.probability=0.1"}),
                      log);
  EXPECT_EQ(faulty.oracle_mismatches, 0);
  EXPECT_EQ(faulty.divergences(), 0);
  EXPECT_EQ(faulty.verify_failures, 0);
  EXPECT_EQ(faulty.draft_mismatches, 0) << "no request is decoded over a broken draft suffix or restore";
  EXPECT_EQ(faulty.failed, faulty.pd_failed + faulty.pd_restore_failed);
  EXPECT_GT(faulty.pd_failed, 0);
  if (testing::world_rank() == 0)
    std::printf("[ pd spec ] under faults: %lld broken transfers, %lld broken restores failed\n",
                static_cast<long long>(faulty.pd_failed), static_cast<long long>(faulty.pd_restore_failed));
}

}  // namespace
}  // namespace kvgrid
