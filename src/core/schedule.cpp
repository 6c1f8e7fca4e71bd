#include "core/schedule.hpp"

#include <algorithm>
#include <charconv>

#include "core/check.hpp"

namespace kvgrid {

namespace {

ChoiceSource* g_source = nullptr;

template <typename T>
bool parse_number(std::string_view s, T& out) {
  if (s.empty()) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

}  // namespace

Schedule Schedule::parse(std::string_view text, std::string_view what) {
  Schedule s;
  for (std::size_t pos = 0; !text.empty() && pos <= text.size();) {  // "a,b," has an empty third entry
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view entry = text.substr(pos, comma - pos);
    const std::size_t colon = entry.find(':');
    SchedulePoint p;
    if (colon == std::string_view::npos || !parse_number(entry.substr(0, colon), p.rank) || p.rank < 0 ||
        !parse_number(entry.substr(colon + 1), p.index))
      throw InputError(std::string(what) + ": entry '" + std::string(entry) +
                       "' is not rank:index (non-negative integers, e.g. 1:4,3:0)");
    if (s.contains(p)) throw InputError(std::string(what) + ": entry '" + std::string(entry) + "' appears twice");
    s = s.with(p);
    pos = comma + 1;
  }
  return s;
}

std::string Schedule::str() const {
  std::string out;
  for (const auto& p : flips) out += (out.empty() ? "" : ",") + std::to_string(p.rank) + ":" + std::to_string(p.index);
  return out;
}

std::vector<std::uint32_t> Schedule::for_rank(int rank) const {
  std::vector<std::uint32_t> out;
  for (const auto& p : flips)
    if (p.rank == rank) out.push_back(p.index);
  return out;
}

bool Schedule::contains(SchedulePoint p) const { return std::binary_search(flips.begin(), flips.end(), p); }

Schedule Schedule::with(SchedulePoint p) const {
  Schedule s = *this;
  s.flips.insert(std::lower_bound(s.flips.begin(), s.flips.end(), p), p);
  return s;
}

Schedule Schedule::without(SchedulePoint p) const {
  Schedule s = *this;
  s.flips.erase(std::remove(s.flips.begin(), s.flips.end(), p), s.flips.end());
  return s;
}

bool ChoiceSource::answer(bool default_answer, std::string what, const char* yes, const char* no) {
  const auto index = static_cast<std::uint32_t>(records_.size());
  const bool flip = std::binary_search(flips_.begin(), flips_.end(), index);
  applied_ += flip ? 1 : 0;
  const bool a = flip != default_answer;
  records_.push_back({index, step_, default_answer, a, false, std::move(what), a ? yes : no});
  return a;
}

void ChoiceSource::dominate_since(std::size_t mark) {
  for (std::size_t i = mark; i < records_.size(); ++i)
    if (!records_[i].default_answer && !records_[i].answer) records_[i].dominated = true;
}

void set_choice_source(ChoiceSource* source) { g_source = source; }
ChoiceSource* choice_source() { return g_source; }

}  // namespace kvgrid
