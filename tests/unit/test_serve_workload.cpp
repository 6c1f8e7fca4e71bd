// Serving workloads: exact token streams for a small seed (pinned: a change to generation shows
// here), conversation structure, Mooncake parsing and its error messages, and cost arithmetic.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/check.hpp"
#include "core/hash.hpp"
#include "core/rng.hpp"
#include "kernels/kv_math.hpp"
#include "runtime/cost.hpp"
#include "runtime/prompts_ahead.hpp"
#include "runtime/serve_workload.hpp"

namespace kvgrid {
namespace {

ExperimentConfig exp_with(std::vector<std::string> sets, std::int64_t seed = 7) {
  sets.push_back("workload.vocab=1000");
  return parse_experiment("", "w", sets, seed);
}

std::vector<RequestSpec> drain(ServeWorkload& w) {
  std::vector<RequestSpec> all;
  for (std::uint64_t now = 0; !w.exhausted(); now += 1000) {
    auto a = w.arrivals(now);
    for (auto& r : a) {
      w.finished(r.id, now);
      all.push_back(std::move(r));
    }
    if (a.empty() && !w.next_arrival_ns() && !w.exhausted()) ADD_FAILURE() << "workload stuck";
    if (all.size() > 10000) break;
  }
  return all;
}

TEST(GspWorkload, PinnedTokenStreamForSeed7) {
  auto e = exp_with({"workload.kind=gsp", "workload.gsp.groups=2", "workload.gsp.prompts_per_group=2",
                     "workload.gsp.system_prompt_len=8", "workload.gsp.question_len=4", "workload.gsp.output_len=3"});
  auto w = make_serve_workload(e.workload, 7);
  auto a = w->arrivals(0);
  ASSERT_EQ(a.size(), 4u);
  for (const auto& r : a) {
    EXPECT_EQ(r.prompt.size(), 12u);
    EXPECT_EQ(r.output_len, 3u);
    EXPECT_EQ(r.arrival_ns, 0u);
  }
  // Two prompts per system prompt: exactly two distinct 8-token prefixes, each used twice.
  std::map<std::vector<TokenId>, int> systems;
  for (const auto& r : a) ++systems[std::vector<TokenId>(r.prompt.begin(), r.prompt.begin() + 8)];
  ASSERT_EQ(systems.size(), 2u);
  for (const auto& [k, n] : systems) EXPECT_EQ(n, 2);
  std::printf("gsp seed 7 first prompt:");
  for (auto t : a[0].prompt) std::printf(" %u", t);
  std::printf("\n");
  EXPECT_EQ(a[0].prompt, (std::vector<TokenId>{454, 944, 205, 899, 199, 362, 849, 259, 242, 713, 238, 271}));
  EXPECT_EQ(model_output(a[0].prompt, 3, 1000), (std::vector<TokenId>{419, 418, 957}));
  auto again = make_serve_workload(e.workload, 7)->arrivals(0);
  EXPECT_EQ(again[3].prompt, a[3].prompt);
  EXPECT_NE(make_serve_workload(e.workload, 8)->arrivals(0)[0].prompt, a[0].prompt);
}

TEST(GspWorkload, TurnsResendTheHistoryWithTheModelsOutput) {
  auto e = exp_with({"workload.kind=gsp", "workload.gsp.groups=1", "workload.gsp.prompts_per_group=1",
                     "workload.gsp.system_prompt_len=6", "workload.gsp.question_len=3", "workload.gsp.output_len=2",
                     "workload.gsp.turns=3"});
  auto w = make_serve_workload(e.workload, 1);
  auto t0 = w->arrivals(0);
  ASSERT_EQ(t0.size(), 1u);
  EXPECT_FALSE(w->next_arrival_ns().has_value());  // turn 1 waits for turn 0 to finish
  EXPECT_TRUE(w->arrivals(1'000'000).empty());
  w->finished(t0[0].id, 5000);
  auto t1 = w->arrivals(5000);
  ASSERT_EQ(t1.size(), 1u);
  EXPECT_EQ(t1[0].arrival_ns, 5000u);
  EXPECT_EQ(t1[0].round, 1u);
  auto out0 = model_output(t0[0].prompt, 2, 1000);
  ASSERT_EQ(t1[0].prompt.size(), 9u + 2u + 3u);
  EXPECT_TRUE(std::equal(t0[0].prompt.begin(), t0[0].prompt.end(), t1[0].prompt.begin()));
  EXPECT_TRUE(std::equal(out0.begin(), out0.end(), t1[0].prompt.begin() + 9));
  w->finished(t1[0].id, 6000);
  auto t2 = w->arrivals(6000);
  ASSERT_EQ(t2.size(), 1u);
  w->finished(t2[0].id, 7000);
  EXPECT_TRUE(w->exhausted());
}

TEST(MultiturnWorkload, RoundsMaxInFlightAndBarrier) {
  auto e = exp_with({"workload.kind=multiturn", "workload.multiturn.clients=3", "workload.multiturn.rounds=2",
                     "workload.multiturn.request_length=5", "workload.multiturn.output_length=2",
                     "workload.multiturn.sub_question_length=3", "workload.multiturn.max_in_flight=2",
                     "workload.multiturn.round_barrier=true"});
  auto w = make_serve_workload(e.workload, 1);
  EXPECT_EQ(w->total_requests(), 6u);
  auto first = w->arrivals(0);
  ASSERT_EQ(first.size(), 2u);  // max_in_flight
  w->finished(first[0].id, 10);
  auto more = w->arrivals(10);
  ASSERT_EQ(more.size(), 1u);  // the third client's round 0; round 1 waits for the barrier
  EXPECT_EQ(more[0].round, 0u);
  w->finished(first[1].id, 20);
  EXPECT_TRUE(w->arrivals(20).empty());
  w->finished(more[0].id, 30);
  auto r1 = w->arrivals(30);
  ASSERT_EQ(r1.size(), 2u);
  EXPECT_EQ(r1[0].round, 1u);
  EXPECT_EQ(r1[0].prompt.size(), 5u + 2u + 3u);
  for (const auto& r : r1) w->finished(r.id, 40);
  auto all = drain(*w);
  EXPECT_EQ(all.size(), 1u);  // the last client's round 1
  EXPECT_TRUE(w->exhausted());
}

std::string write_trace(const std::string& name, const std::string& text) {
  auto path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path) << text;
  return path;
}

TEST(MooncakeWorkload, BlocksMapToFixedTokensAndTheLastBlockIsTruncated) {
  auto path = write_trace("kvgrid-mc-ok.jsonl",
                          "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [7, 9]}\n"
                          "\n"
                          "{\"timestamp\": 2.5, \"input_length\": 512, \"output_length\": 0, \"hash_ids\": [7]}\n");
  auto e = exp_with({"workload.kind=mooncake", "workload.mooncake.trace=" + path, "workload.mooncake.time_scale=2"});
  auto w = make_serve_workload(e.workload, 1);
  EXPECT_EQ(w->total_requests(), 2u);
  auto a = w->arrivals(0);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].prompt.size(), 600u);
  std::vector<TokenId> b7(512), b9(512);
  mooncake_block_tokens(7, b7, 1000);
  mooncake_block_tokens(9, b9, 1000);
  // A block's tokens are fixed for good: pinned (computed apart, in Python), and each token's hash
  // reduced with `%` (the loop reduces without dividing: core/fast_mod.hpp).
  EXPECT_EQ(b7[0], 140U);
  EXPECT_EQ(b7[511], 874U);
  EXPECT_EQ(b9[100], 707U);
  for (std::size_t i = 0; i < 512; ++i)
    ASSERT_EQ(b9[i], static_cast<TokenId>(mix64(hash_combine(9 * 0x9e3779b97f4a7c15ULL + 0x4d6f6f6eULL, i)) % 1000)) << i;
  EXPECT_TRUE(std::equal(b7.begin(), b7.end(), a[0].prompt.begin()));
  EXPECT_TRUE(std::equal(b9.begin(), b9.begin() + 88, a[0].prompt.begin() + 512));
  EXPECT_EQ(w->next_arrival_ns(), std::optional<std::uint64_t>(5'000'000));  // 2.5 ms × 2
  auto b = w->arrivals(5'000'000);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].output_len, 1u);  // at least one token is generated
  EXPECT_TRUE(std::equal(b7.begin(), b7.end(), b[0].prompt.begin()));
  EXPECT_TRUE(w->exhausted());
}

TEST(MooncakeWorkload, BadLinesAreNamedByLineNumber) {
  struct Case {
    std::string text, expect;
  };
  const std::vector<Case> cases = {
      {"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n{oops\n", ":2: malformed JSON"},
      {"{\"timestamp\": 0, \"input_length\": 10, \"hash_ids\": [1]}\n", ":1: expected timestamp"},
      {"{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1]}\n", ":1: input_length 600 does not fit 1 blocks"},
      {"{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n"
       "{\"timestamp\": 4, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n", ":2: timestamps go backwards"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    auto path = write_trace("kvgrid-mc-bad-" + std::to_string(i) + ".jsonl", cases[i].text);
    auto e = exp_with({"workload.kind=mooncake", "workload.mooncake.trace=" + path});
    try {
      make_serve_workload(e.workload, 1);
      ADD_FAILURE() << "case " << i << " accepted";
    } catch (const InputError& err) {
      EXPECT_NE(std::string(err.what()).find(path + cases[i].expect), std::string::npos) << err.what();
    }
  }
  auto e = exp_with({"workload.kind=mooncake", "workload.mooncake.trace=/nonexistent.jsonl"});
  EXPECT_THROW(make_serve_workload(e.workload, 1), InputError);
}

TEST(MooncakeWorkload, SharedTraceParsesWithFirstN) {
  const std::string path = std::string(KVGRID_SOURCE_DIR) + "/../shared/traces/mooncake_synthetic_trace.jsonl";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared trace not beside the checkout";
  auto e = exp_with({"workload.kind=mooncake", "workload.mooncake.trace=" + path, "workload.mooncake.first_n=50"});
  auto w = make_serve_workload(e.workload, 1);
  EXPECT_EQ(w->total_requests(), 50u);
  auto a = w->arrivals(0);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a[0].prompt.size(), 40160u);
  EXPECT_EQ(a[0].output_len, 6u);
}

TEST(MooncakeWorkload, PromptsMadeAheadOnTheHelperThreadAreThePromptsMadeOnArrival) {
  // engine.helper_thread: the same requests, prompts and sessions arrive at every step, whether the
  // prompts are made on arrival or on the helper thread ahead of it (blocks repeat, so the block
  // cache is exercised; 40 lines, more than the helper makes ahead).
  const std::uint64_t seed = 11;
  Rng rng(seed);
  std::string text;
  for (int i = 0; i < 40; ++i) {
    const std::size_t blocks = 1 + rng.below(6);
    std::string ids;
    for (std::size_t b = 0; b < blocks; ++b) ids += (b ? ", " : "") + std::to_string(rng.below(12));
    text += "{\"timestamp\": " + std::to_string(i / 3) + ", \"input_length\": " + std::to_string(blocks * 512 - rng.below(500)) +
            ", \"output_length\": " + std::to_string(rng.below(9)) + ", \"hash_ids\": [" + ids + "], \"session_id\": " +
            std::to_string(rng.below(4)) + "}\n";
  }
  const auto path = write_trace("kvgrid-mc-ahead.jsonl", text);
  auto e = exp_with({"workload.kind=mooncake", "workload.mooncake.trace=" + path});
  auto on_arrival = make_serve_workload(e.workload, 1), ahead = make_serve_workload(e.workload, 1);
  ahead->make_ahead();
  for (std::uint64_t now = 0; !on_arrival->exhausted(); now += 1'000'000) {
    const auto a = on_arrival->arrivals(now), b = ahead->arrivals(now);
    ASSERT_EQ(a.size(), b.size()) << "at " << now << " (seed " << seed << ")";
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].id, b[i].id);
      EXPECT_EQ(a[i].arrival_ns, b[i].arrival_ns);
      EXPECT_EQ(a[i].output_len, b[i].output_len);
      EXPECT_EQ(a[i].session, b[i].session);
      EXPECT_EQ(a[i].prompt, b[i].prompt) << "request " << a[i].id.value() << " (seed " << seed << ")";
      // Marks only with the helper: the prefix hash at the end of each whole block of the prompt
      // (blocks repeat after different prefixes, so the remembered block ends are exercised).
      EXPECT_TRUE(a[i].prefix_marks.empty() && a[i].mark_stride == 0);
      ASSERT_EQ(b[i].prefix_marks.size(), b[i].prompt.size() / 512) << "request " << b[i].id.value();
      EXPECT_EQ(b[i].mark_stride, b[i].prefix_marks.empty() ? 0u : 512u);
      std::uint64_t ph = kernels::kPrefixSeed;
      for (std::size_t q = 0; q < b[i].prefix_marks.size() * 512; ++q) {
        ph = kernels::prefix_hash_step(ph, b[i].prompt[q]);
        if ((q + 1) % 512 == 0) {
          ASSERT_EQ(b[i].prefix_marks[q / 512], ph) << "request " << b[i].id.value() << " block " << q / 512;
        }
      }
    }
    const auto ea = on_arrival->take_session_events(), eb = ahead->take_session_events();
    ASSERT_EQ(ea.size(), eb.size());
    for (std::size_t i = 0; i < ea.size(); ++i) EXPECT_TRUE(ea[i].kind == eb[i].kind && ea[i].session == eb[i].session);
  }
  EXPECT_TRUE(ahead->exhausted());
}

TEST(PromptsAhead, MakesEachPromptOnceInOrderAndRethrowsAFailureAtItsTurn) {
  std::vector<std::size_t> made;  // (written by the helper thread, read after it stopped)
  {
    PromptsAhead p(3, 20, 2, [&made](std::size_t i) {
      made.push_back(i);
      if (i == 9) throw InputError("prompt 9 cannot be made");
      return MadePrompt{std::vector<TokenId>(i, static_cast<TokenId>(i)), {i}};
    });
    for (std::size_t i = 3; i < 9; ++i) {
      const MadePrompt m = p.take(i);
      EXPECT_EQ(m.tokens, std::vector<TokenId>(i, static_cast<TokenId>(i)));
      EXPECT_EQ(m.marks, std::vector<std::uint64_t>{i});
    }
    EXPECT_THROW(p.take(10), InternalError);  // out of order
    EXPECT_THROW(p.take(9), InputError);      // its failure, at its turn
  }
  EXPECT_EQ(made, (std::vector<std::size_t>{3, 4, 5, 6, 7, 8, 9}));  // once each, in order, none after the failure
  {
    PromptsAhead stopped(0, 1000, 4, [](std::size_t i) { return MadePrompt{std::vector<TokenId>(i), {}}; });
    EXPECT_TRUE(stopped.take(0).tokens.empty());
  }  // (destroyed with prompts made and not taken: the helper stops, nothing hangs)
}

TEST(Cost, HandComputedStepTimes) {
  CostConfig c;  // defaults: 1250 ns/token/layer, 0.041 ns/pair/layer, 150 µs/layer decode
  StepWork w;
  w.add(0, 100, /*prefill=*/true);   // 100 tokens, pairs 1 + 2 + ... + 100 = 5050
  EXPECT_EQ(w.prefill_tokens, 100u);
  EXPECT_EQ(w.attention_pairs, 5050u);
  w.add(100, 101, /*prefill=*/false);
  EXPECT_EQ(w.decode_tokens, 1u);
  // 4 layers at TP2 × CP2: (100 × 1250 + 5050 × 0.041) × 4 / 4 + 150000 × 4 / 2
  EXPECT_EQ(compute_ns(c, w, 4, 2, 2), static_cast<std::uint64_t>(125000.0 + 207.05 + 300000.0));
  StepWork only_prefill;
  only_prefill.add(10, 20, true);  // pairs 11 + ... + 20 = 155
  EXPECT_EQ(only_prefill.attention_pairs, 155u);
}

}  // namespace
}  // namespace kvgrid

namespace kvgrid {
namespace {

// A -> B -> A: a lane's requests go one after another; A comes back identical, B shares exactly
// shared_len tokens with A's start.
TEST(AbaWorkload, LanesSendABAIdenticalWithBSharingAsConfigured) {
  auto e = exp_with({"workload.kind=aba", "workload.aba.lanes=3", "workload.aba.a_len=40", "workload.aba.b_len=30",
                     "workload.aba.shared_len=12", "workload.aba.output_len=2", "workload.aba.repeats=2"});
  auto w = make_serve_workload(e.workload, 7);
  EXPECT_EQ(w->total_requests(), 15u);
  auto first = w->arrivals(0);
  ASSERT_EQ(first.size(), 3u);  // one per lane: the next waits for it to finish
  EXPECT_TRUE(w->arrivals(0).empty());
  std::vector<std::vector<RequestSpec>> lanes(3);
  for (std::size_t l = 0; l < 3; ++l) lanes[l].push_back(first[l]);
  for (std::uint64_t now = 1; now < 5; ++now) {  // each lane's next request once its previous one finished
    for (std::size_t l = 0; l < 3; ++l) w->finished(lanes[l].back().id, now);
    auto next = w->arrivals(now);
    ASSERT_EQ(next.size(), 3u);
    for (std::size_t l = 0; l < 3; ++l) lanes[l].push_back(next[l]);
  }
  for (std::size_t l = 0; l < 3; ++l) w->finished(lanes[l].back().id, 5);
  EXPECT_TRUE(w->exhausted());
  for (const auto& lane : lanes) {
    ASSERT_EQ(lane.size(), 5u);
    const auto& A = lane[0].prompt;
    const auto& B = lane[1].prompt;
    ASSERT_EQ(A.size(), 40u);
    ASSERT_EQ(B.size(), 30u);
    EXPECT_EQ(lane[2].prompt, A);
    EXPECT_EQ(lane[3].prompt, B);
    EXPECT_EQ(lane[4].prompt, A);
    EXPECT_TRUE(std::equal(A.begin(), A.begin() + 12, B.begin()));
    EXPECT_NE(A[12], B[12]);  // seed 7 draws differ at the first own token
    for (const auto& r : lane) EXPECT_EQ(r.output_len, 2u);
  }
  EXPECT_NE(lanes[0][0].prompt, lanes[1][0].prompt);
  auto bad = [](std::vector<std::string> sets) {
    try {
      exp_with(std::move(sets));
    } catch (const InputError& x) {
      return std::string(x.what());
    }
    return std::string();
  };
  EXPECT_NE(bad({"workload.kind=aba", "workload.aba.a_len=20", "workload.aba.shared_len=20"})
                .find("workload.aba.shared_len = 20 must be below workload.aba.a_len = 20"),
            std::string::npos);
}

// Concurrent cold prefills: every request arrives at once; a group's requests share its prefix
// and differ after it.
TEST(ColdPrefixWorkload, AGroupArrivesTogetherSharingItsPrefix) {
  auto e = exp_with({"workload.kind=cold_prefix", "workload.cold_prefix.groups=2", "workload.cold_prefix.requests=3",
                     "workload.cold_prefix.prefix_len=20", "workload.cold_prefix.suffix_len=5",
                     "workload.cold_prefix.output_len=4"});
  auto w = make_serve_workload(e.workload, 7);
  auto a = w->arrivals(0);
  ASSERT_EQ(a.size(), 6u);
  for (const auto& r : a) {
    EXPECT_EQ(r.prompt.size(), 25u);
    EXPECT_EQ(r.output_len, 4u);
    EXPECT_EQ(r.arrival_ns, 0u);
  }
  for (std::size_t g = 0; g < 2; ++g)
    for (std::size_t i = 1; i < 3; ++i) {
      const auto& x = a[g * 3].prompt;
      const auto& y = a[g * 3 + i].prompt;
      EXPECT_TRUE(std::equal(x.begin(), x.begin() + 20, y.begin()));
      EXPECT_FALSE(std::equal(x.begin() + 20, x.end(), y.begin() + 20));
    }
  EXPECT_FALSE(std::equal(a[0].prompt.begin(), a[0].prompt.begin() + 20, a[3].prompt.begin()));
  for (const auto& r : a) w->finished(r.id, 1);
  EXPECT_TRUE(w->exhausted());
}

}  // namespace
}  // namespace kvgrid
