#include "core/decision_log.hpp"

#include <sstream>

#include "core/hash.hpp"

namespace kvgrid {

void DecisionLog::record(std::string_view name, std::uint64_t args_digest, std::uint64_t result_digest) {
  DecisionRecord r{seq_++, step_, std::string(name), args_digest, result_digest};
  digest_ = hash_combine(hash_combine(hash_combine(digest_, hash_string(name)), args_digest), result_digest);
  recent_.push_back(r);
  if (recent_.size() > recent_capacity) recent_.pop_front();
  pending_.push_back(std::move(r));
}

std::string DecisionLog::recent_text() const {
  std::ostringstream os;
  os << "last decisions (seq step name args result):";
  if (recent_.empty()) os << " none";
  for (const auto& r : recent_)
    os << "\n    " << r.seq << " " << r.step << " " << r.name << " " << std::hex << r.args_digest << " "
       << r.result_digest << std::dec;
  return os.str();
}

std::vector<DecisionRecord> DecisionLog::take_new() {
  std::vector<DecisionRecord> out;
  out.swap(pending_);
  return out;
}

}  // namespace kvgrid
