// The decision log: every cache decision a rank takes, in the order it takes it.
//
// A decision point records `(seq, step, name, arguments, results)`: up to 3 argument values and 2
// result values that the caller chose as what must agree (readable in the trace), and digests of
// them (plus, optionally, a digest of something larger such as the eviction victims). Ranks that must agree
// (TP/CP peers of a stage; one TP/CP position across stages) must produce equal logs; `kvgrid
// check` compares them offline, and the online consensus checker (a later protocol) compares their
// running digests. The log keeps the last few entries in memory for the watchdog's report and
// hands new entries to the trace writer (`take_new`); with `keep_history` it also keeps the
// records and prefix digests the online checker (protocols/consensus_check) compares.
//
// Use the macro at decision points so that the name is a literal and the call is cheap:
//     KVGRID_CONSENSUS(log, "match_prefix", {request, prompt_len}, {matched});
#pragma once

#include <cstdint>
#include <deque>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace kvgrid {

struct DecisionRecord {
  std::uint64_t seq = 0;
  std::uint64_t step = 0;
  std::string name;  // at most 31 characters in the trace
  std::uint64_t args_digest = 0;
  std::uint64_t result_digest = 0;
  std::int64_t args[3] = {0, 0, 0};
  std::int64_t results[2] = {0, 0};
  std::uint8_t n_args = 0, n_results = 0;
  std::string text() const;  // "match_prefix(12, 300) -> (256)"
  // "decision 41, step 12: match_prefix(12, 300) -> (256)  [args 0x…, results 0x…]"
  std::string side_text() const;
};

// How a first unequal decision between two ranks is classified and printed, the same by the
// offline checker (`kvgrid check`) and the online one (protocol.consensus_check).
// kind: "call order" (names differ), "arguments", "results", "log length".
std::string divergence_kind(const DecisionRecord& a, const DecisionRecord& b);
std::string describe_divergence(const std::string& coords_a, const std::string& coords_b, int rank_a, int rank_b,
                                std::uint64_t seq, std::uint64_t step, const std::string& kind, const std::string& side_a,
                                const std::string& side_b);

class DecisionLog {
 public:
  void set_step(std::uint64_t step) { step_ = step; }
  std::uint64_t step() const { return step_; }
  void record(std::string_view name, std::initializer_list<std::int64_t> args,
              std::initializer_list<std::int64_t> results, std::uint64_t extra_result_digest = 0);

  std::uint64_t size() const { return seq_; }
  // Order-dependent digest of every record so far (name, args, results).
  std::uint64_t running_digest() const { return digest_; }
  // The last `recent_capacity` records, oldest first.
  const std::deque<DecisionRecord>& recent() const { return recent_; }
  std::string recent_text() const;
  // Records not yet taken (for the trace writer); clears the pending list.
  std::vector<DecisionRecord> take_new();

  // History for the online consensus checker (off by default: no cost). With it on, the log keeps
  // every record and the running digest after each, from `history_base()` on; `prune_before(n)`
  // drops what precedes entry n once peers agreed on it.
  void keep_history(bool on) { history_on_ = on; }
  bool keeps_history() const { return history_on_; }
  std::uint64_t history_base() const { return base_; }
  // The running digest after the first `len` records (history_base() <= len <= size()).
  std::uint64_t digest_at(std::uint64_t len) const;
  const DecisionRecord& entry(std::uint64_t seq) const;  // history_base() <= seq < size()
  void prune_before(std::uint64_t len);

 private:
  static constexpr std::size_t recent_capacity = 8;
  std::uint64_t step_ = 0, seq_ = 0, digest_ = 0;
  std::deque<DecisionRecord> recent_;
  std::vector<DecisionRecord> pending_;
  bool history_on_ = false;
  std::uint64_t base_ = 0, base_digest_ = 0;
  std::deque<DecisionRecord> history_;
  std::deque<std::uint64_t> history_digest_;  // running digest after each kept record
};

}  // namespace kvgrid

#define KVGRID_CONSENSUS(log, name, ...) (log).record((name), __VA_ARGS__)
