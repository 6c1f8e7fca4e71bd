// The decision log: every cache decision a rank takes, in the order it takes it.
//
// A decision point records `(seq, step, name, arguments, results)`: up to 3 argument values and 2
// result values that the caller chose as what must agree (readable in the trace), and digests of
// them (plus, optionally, a digest of something larger such as the eviction victims). Ranks that must agree
// (TP/CP peers of a stage; one TP/CP position across stages) must produce equal logs; `kvgrid
// check` compares them offline, and the online consensus checker (a later protocol) compares their
// running digests. The log keeps the last few entries in memory for the watchdog's report and
// hands new entries to the trace writer (`take_new`).
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
};

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

 private:
  static constexpr std::size_t recent_capacity = 8;
  std::uint64_t step_ = 0, seq_ = 0, digest_ = 0;
  std::deque<DecisionRecord> recent_;
  std::vector<DecisionRecord> pending_;
};

}  // namespace kvgrid

#define KVGRID_CONSENSUS(log, name, ...) (log).record((name), __VA_ARGS__)
