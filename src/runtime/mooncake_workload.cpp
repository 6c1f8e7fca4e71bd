#include "runtime/mooncake_workload.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include "core/check.hpp"
#include "core/fast_mod.hpp"
#include "core/hash.hpp"
#include "kernels/kv_math.hpp"
#include "runtime/prompts_ahead.hpp"

namespace kvgrid {

void mooncake_block_tokens(std::uint64_t hash_id, std::span<TokenId> out, std::uint64_t vocab) {
  const FastMod64 v(vocab);  // (a division per token was a seventh of this loop's time)
  const std::uint64_t seed = hash_id * 0x9e3779b97f4a7c15ULL + 0x4d6f6f6eULL;
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<TokenId>(v.mod(mix64(hash_combine(seed, i))));
}

namespace {

// Mooncake replay: requests in file order (timestamps are non-decreasing), tokens made on demand.
class MooncakeWorkload : public ServeWorkload {
 public:
  struct Line {
    std::uint64_t arrival_ns;
    std::uint32_t input_length, output_length;
    std::vector<std::uint64_t> hash_ids;
    SessionId session = 0;
  };
  MooncakeWorkload(std::vector<Line> lines, std::uint64_t vocab) : lines_(std::move(lines)), vocab_(vocab) {
    for (std::size_t i = 0; i < lines_.size(); ++i)
      if (lines_[i].session) last_of_session_[lines_[i].session] = i;
  }

  std::vector<RequestSpec> arrivals(std::uint64_t now_ns) override {
    std::vector<RequestSpec> out;
    while (next_ < lines_.size() && lines_[next_].arrival_ns <= now_ns) {
      const Line& l = lines_[next_];
      RequestSpec r;
      r.id = RequestId(next_);
      r.arrival_ns = l.arrival_ns;
      r.output_len = std::max<std::uint32_t>(l.output_length, 1);
      r.session = l.session;
      if (l.session && opened_.insert(l.session).second) events_.push_back(SessionEvent{SessionEvent::Open, l.session});
      MadePrompt p = ahead_ ? ahead_->take(next_) : prompt(next_);
      r.prompt = std::move(p.tokens);
      r.prefix_marks = std::move(p.marks);
      r.mark_stride = r.prefix_marks.empty() ? 0 : static_cast<std::uint32_t>(kBlock);
      out.push_back(std::move(r));
      ++next_;
    }
    return out;
  }
  // engine.helper_thread: the prompts are made on a thread of their own, a few ahead of their
  // arrival (from here on only that thread makes blocks), with their prefix marks: the hash chain
  // over a prompt's cached prefix moves off the serving thread.
  void make_ahead() override {
    if (!ahead_ && next_ < lines_.size()) {
      marks_ = true;
      ahead_ = std::make_unique<PromptsAhead>(next_, lines_.size(), kAhead, [this](std::size_t i) { return prompt(i); });
    }
  }
  std::optional<std::uint64_t> next_arrival_ns() const override {
    if (next_ >= lines_.size()) return std::nullopt;
    return lines_[next_].arrival_ns;
  }
  bool exhausted() const override { return next_ >= lines_.size(); }
  std::uint64_t total_requests() const override { return lines_.size(); }
  // A session closes once its last line's request finished.
  void finished(RequestId id, std::uint64_t) override {
    const std::size_t i = static_cast<std::size_t>(id.value());
    if (i < lines_.size() && lines_[i].session && last_of_session_[lines_[i].session] == i)
      events_.push_back(SessionEvent{SessionEvent::Close, lines_[i].session});
  }

  static constexpr std::size_t kBlock = 512;

 private:
  // Line i's prompt (room for its output too: the scheduler keeps this vector as the request's
  // tokens) and, with marks_, the prefix hash at the end of each whole block.
  MadePrompt prompt(std::size_t i) {
    const Line& l = lines_[i];
    MadePrompt m;
    std::vector<TokenId>& p = m.tokens;
    p.reserve(std::max<std::size_t>(l.hash_ids.size() * kBlock, std::size_t{l.input_length} + std::max<std::uint32_t>(l.output_length, 1)));
    for (const std::uint64_t id : l.hash_ids) {  // (appended: never zeroed first)
      const TokenId* t = block(id);
      p.insert(p.end(), t, t + kBlock);
    }
    if (marks_) {
      const std::size_t whole = std::min<std::size_t>(l.hash_ids.size(), l.input_length / kBlock);
      std::uint64_t ph = kernels::kPrefixSeed;
      for (std::size_t k = 0; k < whole; ++k) m.marks.push_back(ph = block_end_hash(ph, l.hash_ids[k], p.data() + k * kBlock));
    }
    p.resize(l.input_length);
    return m;
  }
  // The prefix hash after block `hash_id` (its tokens at `t`) that follows a prefix hashed `before`:
  // remembered (direct-mapped by both), as later turns resend their history.
  std::uint64_t block_end_hash(std::uint64_t before, std::uint64_t hash_id, const TokenId* t) {
    if (end_hash_.empty()) end_hash_.resize(kCached);
    EndHash& e = end_hash_[static_cast<std::size_t>(mix64(hash_combine(before, hash_id)) % kCached)];
    if (e.filled && e.before == before && e.hash_id == hash_id) return e.after;
    std::uint64_t ph = before;
    for (std::size_t j = 0; j < kBlock; ++j) ph = kernels::prefix_hash_step(ph, t[j]);
    e = EndHash{before, hash_id, ph, true};
    return ph;
  }
  // A block's kBlock tokens: later turns resend their history, so the blocks made recently are kept
  // (direct-mapped by hash id; the tokens are the same either way). Valid until the next call.
  const TokenId* block(std::uint64_t hash_id) {
    if (cached_.empty()) {  // (only the rank that draws the arrivals makes tokens)
      cached_.resize(kCached * kBlock);
      cached_id_.resize(kCached);
      filled_.resize(kCached);
    }
    const std::size_t at = static_cast<std::size_t>(mix64(hash_id) % kCached);
    TokenId* kept = cached_.data() + at * kBlock;
    if (!filled_[at] || cached_id_[at] != hash_id) {
      mooncake_block_tokens(hash_id, std::span<TokenId>(kept, kBlock), vocab_);
      cached_id_[at] = hash_id;
      filled_[at] = 1;
    }
    return kept;
  }
  static constexpr std::size_t kCached = 4096;  // blocks (8 MiB of tokens), block end hashes
  struct EndHash {
    std::uint64_t before = 0, hash_id = 0, after = 0;
    bool filled = false;
  };
  std::vector<EndHash> end_hash_;
  bool marks_ = false;  // (set before the helper thread starts; read only by it after)
  std::vector<std::uint64_t> cached_id_;
  std::vector<std::uint8_t> filled_;
  std::vector<TokenId> cached_;
  std::vector<Line> lines_;
  std::uint64_t vocab_;
  std::size_t next_ = 0;
  std::map<SessionId, std::size_t> last_of_session_;
  std::set<SessionId> opened_;
  static constexpr std::size_t kAhead = 16;  // prompts made and not yet arrived, at most
  std::unique_ptr<PromptsAhead> ahead_;      // (last: its thread stops before the blocks it reads go)
};

}  // namespace

std::unique_ptr<ServeWorkload> make_mooncake(const WorkloadConfig& w) {
  const auto& m = w.mooncake;
  std::ifstream in(m.trace);
  if (!in) throw InputError(m.trace + ": cannot open Mooncake trace (workload.mooncake.trace)");
  std::vector<MooncakeWorkload::Line> lines;
  std::map<std::string, SessionId> session_ids;  // the trace's ids, numbered in order of first appearance
  std::string text;
  std::uint64_t prev = 0;
  for (std::size_t lineno = 1; std::getline(in, text); ++lineno) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (m.first_n > 0 && static_cast<std::int64_t>(lines.size()) >= m.first_n) break;
    auto where = m.trace + ":" + std::to_string(lineno) + ": ";
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      throw InputError(where + "malformed JSON: " + e.what());
    }
    try {
      MooncakeWorkload::Line l;
      const double ts = j.at("timestamp").get<double>();
      const auto in_len = j.at("input_length").get<std::int64_t>();
      const auto out_len = j.at("output_length").get<std::int64_t>();
      l.hash_ids = j.at("hash_ids").get<std::vector<std::uint64_t>>();
      if (ts < 0 || in_len < 1 || out_len < 0 || in_len > 16'000'000)
        throw InputError(where + "timestamp, input_length or output_length out of range");
      if (l.hash_ids.size() * MooncakeWorkload::kBlock < static_cast<std::size_t>(in_len) ||
          (l.hash_ids.size() - 1) * MooncakeWorkload::kBlock >= static_cast<std::size_t>(in_len))
        throw InputError(where + "input_length " + std::to_string(in_len) + " does not fit " +
                         std::to_string(l.hash_ids.size()) + " blocks of 512 tokens");
      l.arrival_ns = static_cast<std::uint64_t>(ts * 1e6 * m.time_scale);
      if (l.arrival_ns < prev) throw InputError(where + "timestamps go backwards");
      prev = l.arrival_ns;
      l.input_length = static_cast<std::uint32_t>(in_len);
      l.output_length = static_cast<std::uint32_t>(out_len);
      if (auto sid = j.find("session_id"); sid != j.end() && !sid->is_null()) {  // optional: integer or string
        std::string key;
        if (sid->is_string()) key = "s:" + sid->get<std::string>();
        else if (sid->is_number_integer() && sid->get<std::int64_t>() >= 0) key = "n:" + std::to_string(sid->get<std::int64_t>());
        else throw InputError(where + "session_id must be a non-negative integer or a string");
        l.session = session_ids.emplace(key, session_ids.size() + 1).first->second;
      }
      lines.push_back(std::move(l));
    } catch (const nlohmann::json::exception& e) {
      throw InputError(where + "expected timestamp, input_length, output_length, hash_ids: " + e.what());
    }
  }
  if (lines.empty()) throw InputError(m.trace + ": no requests");
  return std::make_unique<MooncakeWorkload>(std::move(lines), w.vocab);
}

}  // namespace kvgrid
