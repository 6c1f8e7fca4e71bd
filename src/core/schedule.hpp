// Schedules: the asynchrony of a run as explicit choices (the controlled engine of `kvgrid explore`).
//
// With a choice source installed, every point where a rank observes something asynchronous — the
// simulated engine answering "has this copy completed?" for a copy it has not yet performed — is a
// *choice point*, numbered per rank in program order. Each has a default answer (the modelled
// clock's: complete once its modelled time has passed) and the other answer. A schedule names the
// points where the other answer is taken, as `rank:index` pairs ("1:4,3:0"); every rank reads the
// same schedule and applies its own pairs, so one schedule gives one run on every rank, and a
// schedule that names points a run never reaches is the run without them (exhausted → defaults).
//
// Answers stay monotone: once a rank saw a copy complete it stays complete, and a stream's copies
// complete in order (a later copy reported complete completes those before it).
//
// A consumer that agrees on what it observed (cache/write_acks: the MIN of the leading finished
// ACKs over a stage) marks the points whose other answer could not have changed the agreement as
// *dominated* (`dominate_since`): an early completion on a rank whose count already exceeded the
// agreed MIN. The explorer does not branch on those (docs/exploration.md says why that is sound).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvgrid {

struct SchedulePoint {
  int rank = 0;
  std::uint32_t index = 0;
  auto operator<=>(const SchedulePoint&) const = default;
};

// A set of non-default choices, kept sorted; text form "rank:index,rank:index" ("" = all defaults).
struct Schedule {
  std::vector<SchedulePoint> flips;
  // Throws InputError naming the entry for malformed text (`what`: where it came from).
  static Schedule parse(std::string_view text, std::string_view what = "--schedule");
  std::string str() const;
  // This rank's flipped indices, ascending.
  std::vector<std::uint32_t> for_rank(int rank) const;
  bool contains(SchedulePoint p) const;
  Schedule with(SchedulePoint p) const;
  Schedule without(SchedulePoint p) const;
  std::size_t size() const { return flips.size(); }
  auto operator<=>(const Schedule&) const = default;
};

// One choice point as a rank met it.
struct ChoiceRecord {
  std::uint32_t index = 0;
  std::uint64_t step = 0;
  bool default_answer = false;
  bool answer = false;       // what the run used (≠ default where the schedule flipped it)
  bool dominated = false;    // its other answer could not change any decision (not branched on)
  std::string what;          // e.g. "copy #7 (stream 1, submitted at step 3, modelled pending)"
  std::string said;          // the answer in words: "complete" / "pending", "fires" / "quiet"
};

// A rank's choices for one run: answers from its flips, every point recorded.
class ChoiceSource {
 public:
  explicit ChoiceSource(std::vector<std::uint32_t> flips) : flips_(std::move(flips)) {}
  // `yes` / `no`: the two answers in words, for reports.
  bool answer(bool default_answer, std::string what, const char* yes = "complete", const char* no = "pending");
  void set_step(std::uint64_t step) { step_ = step; }
  std::uint64_t step() const { return step_; }
  // Marks the points recorded since `mark` (a `size()` taken before) as dominated where their
  // other answer was "complete" (an early completion).
  void dominate_since(std::size_t mark);
  std::size_t size() const { return records_.size(); }
  const std::vector<ChoiceRecord>& records() const { return records_; }
  // How many of this rank's flips the run reached.
  std::size_t applied() const { return applied_; }

 private:
  std::vector<std::uint32_t> flips_;
  std::vector<ChoiceRecord> records_;
  std::uint64_t step_ = 0;
  std::size_t applied_ = 0;
};

// The process's choice source (one rank per process); null when runs use their modelled clock.
void set_choice_source(ChoiceSource* source);
ChoiceSource* choice_source();

}  // namespace kvgrid
