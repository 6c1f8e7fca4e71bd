// Sessions under MPI (cache/unified_tree.hpp "Sessions"): agentic sessions with session-aware
// eviction on a FULL + SWA + MAMBA model with the host tier, at every layout of the world
// (tests/layouts.hpp) and in a P/D world. The session events reach every rank at the same step,
// so every rank of every grid takes the same registrations and evictions: oracle OK, no
// divergence (decision logs and tree digests, which fold the references), verify() clean after
// every operation (debug checks: every mark recomputed from the frontiers), the same session
// counters on every rank; late finishers of abandoned sessions register nothing. In P/D the
// decode ranks hold the references, prefill's none — unless cache.pd_prefill_sessions.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/decision_log.hpp"
#include "layouts.hpp"
#include "mpi_util.hpp"
#include "serve_util.hpp"
#include "runtime/experiment.hpp"

namespace kvgrid {
namespace {

std::vector<std::string> agentic_sets(std::int64_t host_pages) {
  return {"model.layers=8", "model.kv_heads=4", "model.head_dim=4",
          "model.layer_types=full,swa,full,swa,full,mamba,full,mamba", "model.swa_window=24", "model.mamba_chunk=8",
          "model.mamba_state=2", "cache.page_size=8", "cache.device_pages=72", "cache.swa_pages=48",
          "cache.mamba_slots=24", "cache.host_pages=" + std::to_string(host_pages), "cache.eviction=session",
          "workload.kind=agentic", "workload.request_rate=200", "workload.agentic.sessions=8",
          "workload.agentic.max_active=4", "workload.agentic.system_prompt_len=96", "workload.agentic.task_len=32",
          "workload.agentic.turns_min=2", "workload.agentic.turns_max=5", "workload.agentic.tool_output_min=8",
          "workload.agentic.tool_output_max=96", "workload.agentic.output_len=6", "workload.agentic.tool_time_ms=2",
          "workload.agentic.subagent_prob=0.2", "workload.agentic.subagent_turns=2", "workload.agentic.abandon_prob=0.3",
          "workload.agentic.abandon_after_ms=0.05", "workload.agentic.max_context=1024", "engine.chunk_size=64",
          "engine.max_running=4", "engine.check_every=5", "engine.debug_checks=true"};
}

void expect_sessions_agree(const ServeResult& r, bool pd) {
  EXPECT_EQ(r.oracle_mismatches, 0);
  EXPECT_EQ(r.divergences(), 0);
  EXPECT_EQ(r.verify_failures, 0);
  EXPECT_GT(r.finished, 8);
  if (testing::world_rank() != 0) return;
  const RankSummaryRow* ref = nullptr;
  std::int64_t prefill_opened = 0;
  for (const auto& row : r.all) {
    if (pd && row.group == 0) {  // prefill: no references
      prefill_opened += row.sessions_opened;
      continue;
    }
    if (!ref) ref = &row;
    SCOPED_TRACE("rank " + std::to_string(row.rank));
    EXPECT_EQ(row.sessions_opened, ref->sessions_opened);
    EXPECT_EQ(row.sessions_closed, ref->sessions_closed);
    EXPECT_EQ(row.session_registered, ref->session_registered);
    EXPECT_EQ(row.session_stale_finishes, ref->session_stale_finishes);
    EXPECT_EQ(row.forced_referenced_tokens, ref->forced_referenced_tokens);
  }
  ASSERT_NE(ref, nullptr);
  EXPECT_EQ(prefill_opened, 0) << "P/D prefill tracks no session";
  EXPECT_GT(ref->sessions_opened, 8) << "sub-agents open sessions of their own";
  EXPECT_EQ(ref->sessions_opened, ref->sessions_closed);
  EXPECT_EQ(ref->session_registered + ref->session_stale_finishes, r.finished) << "every finisher registered or was refused";
  std::printf("[ sessions ] opened %lld, registered %lld, late finishers refused %lld, forced referenced tokens %lld\n",
              static_cast<long long>(ref->sessions_opened), static_cast<long long>(ref->session_registered),
              static_cast<long long>(ref->session_stale_finishes), static_cast<long long>(ref->forced_referenced_tokens));
}

TEST(Sessions, AgenticSessionsAgreeAtEveryLayout) {
  for (const auto& l : testing::every_layout(testing::world_size()))
    for (std::int64_t seed = 3; seed < 3 + testing::suite_seeds(1); ++seed) {
      SCOPED_TRACE(l.str() + " seed " + std::to_string(seed));
      auto sets = agentic_sets(400);
      for (const auto& s : l.sets()) sets.push_back(s);
      DecisionLog log;
      auto r = testing::serve(parse_experiment("", "sessions-test", sets, seed), log);
      expect_sessions_agree(r, false);
    }
}

TEST(Sessions, DecodeHoldsTheReferencesInPd) {
  const int n = testing::world_size();
  if (n < 2 || n % 2) GTEST_SKIP() << "needs an even world";
  const std::string g = n == 2 ? "tp = 1\n" : n == 4 ? "tp = 2\n" : "tp = 2\npp = 2\n";
  auto sets = agentic_sets(0);
  DecisionLog log;
  auto r = testing::serve(parse_experiment("[topology.prefill]\n" + g + "[topology.decode]\n" + g, "sessions-pd", sets, 4), log);
  expect_sessions_agree(r, true);
  // Configured, prefill holds references too (its own finishers: every prompt at its first token).
  sets.push_back("cache.pd_prefill_sessions=true");
  DecisionLog log2;
  auto r2 = testing::serve(parse_experiment("[topology.prefill]\n" + g + "[topology.decode]\n" + g, "sessions-pd", sets, 4), log2);
  EXPECT_EQ(r2.oracle_mismatches, 0);
  EXPECT_EQ(r2.divergences(), 0);
  EXPECT_EQ(r2.verify_failures, 0);
  if (testing::world_rank() == 0) {
    std::int64_t opened[2] = {0, 0}, registered[2] = {0, 0};
    for (const auto& row : r2.all) {
      opened[row.group] = std::max(opened[row.group], row.sessions_opened);
      registered[row.group] = std::max(registered[row.group], row.session_registered);
    }
    EXPECT_GT(opened[0], 8) << "prefill tracks sessions when configured";
    EXPECT_EQ(opened[0], opened[1]) << "both groups apply the same session events";
    EXPECT_GT(registered[0], 0);
  }
}

}  // namespace
}  // namespace kvgrid
