#include "core/decision_log.hpp"

#include <sstream>

#include "core/check.hpp"
#include "core/hash.hpp"

namespace kvgrid {

void DecisionLog::record(std::string_view name, std::initializer_list<std::int64_t> args,
                         std::initializer_list<std::int64_t> results, std::uint64_t extra_result_digest) {
  DecisionRecord r;
  r.seq = seq_++;
  r.step = step_;
  r.name = std::string(name);
  std::uint64_t a = 0x61726773ULL, res = hash_combine(0x72657375ULL, extra_result_digest);
  for (auto v : args) {
    if (r.n_args < 3) r.args[r.n_args++] = v;
    a = hash_combine(a, static_cast<std::uint64_t>(v));
  }
  for (auto v : results) {
    if (r.n_results < 2) r.results[r.n_results++] = v;
    res = hash_combine(res, static_cast<std::uint64_t>(v));
  }
  r.args_digest = a;
  r.result_digest = res;
  digest_ = hash_combine(hash_combine(hash_combine(digest_, hash_string(name)), a), res);
  recent_.push_back(r);
  if (recent_.size() > recent_capacity) recent_.pop_front();
  if (history_on_) {
    history_.push_back(r);
    history_digest_.push_back(digest_);
  } else {
    base_ = seq_;
    base_digest_ = digest_;
  }
  pending_.push_back(std::move(r));
}

std::string DecisionRecord::text() const {
  std::ostringstream os;
  os << name << "(";
  for (int i = 0; i < n_args; ++i) os << (i ? ", " : "") << args[i];
  os << ") -> (";
  for (int i = 0; i < n_results; ++i) os << (i ? ", " : "") << results[i];
  os << ")";
  return os.str();
}

std::string DecisionRecord::side_text() const {
  std::ostringstream os;
  os << "decision " << seq << ", step " << step << ": " << text() << "  [args 0x" << std::hex << args_digest
     << ", results 0x" << result_digest << "]";
  return os.str();
}

std::string divergence_kind(const DecisionRecord& a, const DecisionRecord& b) {
  if (a.name != b.name) return "call order";
  if (a.args_digest != b.args_digest) return "arguments";
  if (a.result_digest != b.result_digest) return "results";
  return "";
}

std::string describe_divergence(const std::string& coords_a, const std::string& coords_b, int rank_a, int rank_b,
                                std::uint64_t seq, std::uint64_t step, const std::string& kind, const std::string& side_a,
                                const std::string& side_b) {
  std::string why;
  if (kind == "call order") why = "different call order (the ranks took different decisions before)";
  else if (kind == "arguments") why = "different arguments (an earlier state mismatch)";
  else if (kind == "results") why = "same arguments, different results (the operation itself)";
  else why = "one log is longer (the ranks took a different number of decisions)";
  std::ostringstream os;
  os << "Found rank divergence: " << coords_a << " vs " << coords_b << " at decision " << seq << " (step " << step
     << "): " << why << "\n#   rank " << rank_a << ": " << side_a << "\n#   rank " << rank_b << ": " << side_b;
  return os.str();
}

std::string DecisionLog::recent_text() const {
  std::ostringstream os;
  os << "last decisions (seq, step: decision):";
  if (recent_.empty()) os << " none";
  for (const auto& r : recent_) os << "\n    " << r.seq << ", " << r.step << ": " << r.text();
  return os.str();
}

std::uint64_t DecisionLog::digest_at(std::uint64_t len) const {
  KVGRID_CHECK(len >= base_ && len <= seq_, "digest of the first ", len, " decisions; history holds ", base_, "..", seq_);
  return len == base_ ? base_digest_ : history_digest_[len - base_ - 1];
}

const DecisionRecord& DecisionLog::entry(std::uint64_t seq) const {
  KVGRID_CHECK(seq >= base_ && seq < seq_, "decision ", seq, " not in the history ", base_, "..", seq_);
  return history_[seq - base_];
}

void DecisionLog::prune_before(std::uint64_t len) {
  while (base_ < len && !history_.empty()) {
    base_digest_ = history_digest_.front();
    history_.pop_front();
    history_digest_.pop_front();
    ++base_;
  }
}

std::vector<DecisionRecord> DecisionLog::take_new() {
  std::vector<DecisionRecord> out;
  out.swap(pending_);
  return out;
}

}  // namespace kvgrid
