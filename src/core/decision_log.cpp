#include "core/decision_log.hpp"

#include <sstream>

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

std::string DecisionLog::recent_text() const {
  std::ostringstream os;
  os << "last decisions (seq, step: decision):";
  if (recent_.empty()) os << " none";
  for (const auto& r : recent_) os << "\n    " << r.seq << ", " << r.step << ": " << r.text();
  return os.str();
}

std::vector<DecisionRecord> DecisionLog::take_new() {
  std::vector<DecisionRecord> out;
  out.swap(pending_);
  return out;
}

}  // namespace kvgrid
