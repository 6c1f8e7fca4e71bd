#include "runtime/workload.hpp"

#include <algorithm>

#include "core/check.hpp"

namespace kvgrid {

TreeWorkload::TreeWorkload(const TreeWorkloadConfig& cfg, std::uint64_t vocab, std::uint64_t seed)
    : cfg_(cfg), vocab_(vocab), rng_(shared_stream(seed, "workload")) {
  for (std::int64_t f = 0; f < cfg_.prefixes; ++f) families_.push_back(random_tokens(cfg_.prefix_tokens));
}

std::vector<TokenId> TreeWorkload::random_tokens(std::int64_t n) {
  std::vector<TokenId> t(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
  for (auto& x : t) x = static_cast<TokenId>(rng_.below(vocab_));
  return t;
}

std::vector<Request> TreeWorkload::next_step() {
  std::vector<Request> out;
  for (std::int64_t i = 0; i < cfg_.requests_per_step; ++i) {
    Request r;
    r.id = RequestId(next_id_++);
    r.hold_steps = rng_.between(1, cfg_.hold_steps_max);
    const std::int64_t target = rng_.between(cfg_.prompt_tokens_min, cfg_.prompt_tokens_max);
    if (!history_.empty() && rng_.bernoulli(cfg_.followup_prob)) {
      // Next turn of an earlier conversation: its whole prompt, then new tokens.
      const auto& prev = history_[rng_.below(history_.size())];
      r.tokens = prev;
      const auto extra = std::max<std::int64_t>(1, target - static_cast<std::int64_t>(prev.size()));
      auto more = random_tokens(extra);
      r.tokens.insert(r.tokens.end(), more.begin(), more.end());
    } else {
      const auto& fam = families_[rng_.below(families_.size())];
      const auto keep = std::min<std::int64_t>(static_cast<std::int64_t>(fam.size()),
                                               rng_.between(static_cast<std::int64_t>(fam.size()) / 2,
                                                            static_cast<std::int64_t>(fam.size())));
      r.tokens.assign(fam.begin(), fam.begin() + keep);
      auto more = random_tokens(std::max<std::int64_t>(0, target - keep));
      r.tokens.insert(r.tokens.end(), more.begin(), more.end());
    }
    if (static_cast<std::int64_t>(r.tokens.size()) > cfg_.prompt_tokens_max)
      r.tokens.resize(static_cast<std::size_t>(cfg_.prompt_tokens_max));
    if (static_cast<std::int64_t>(r.tokens.size()) < cfg_.prompt_tokens_min) {
      auto more = random_tokens(cfg_.prompt_tokens_min - static_cast<std::int64_t>(r.tokens.size()));
      r.tokens.insert(r.tokens.end(), more.begin(), more.end());
    }
    history_.push_back(r.tokens);
    if (history_.size() > 64) history_.pop_front();
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::uint32_t> encode_requests(std::span<const Request> reqs) {
  std::vector<std::uint32_t> buf;
  buf.push_back(static_cast<std::uint32_t>(reqs.size()));
  for (const auto& r : reqs) {
    buf.push_back(static_cast<std::uint32_t>(r.id.value() & 0xffffffffu));
    buf.push_back(static_cast<std::uint32_t>(r.id.value() >> 32));
    buf.push_back(static_cast<std::uint32_t>(r.hold_steps));
    buf.push_back(static_cast<std::uint32_t>(r.tokens.size()));
    buf.insert(buf.end(), r.tokens.begin(), r.tokens.end());
  }
  return buf;
}

std::vector<Request> decode_requests(std::span<const std::uint32_t> buf) {
  KVGRID_CHECK(!buf.empty(), "empty request buffer");
  std::vector<Request> out(buf[0]);
  std::size_t pos = 1;
  for (auto& r : out) {
    KVGRID_CHECK(pos + 4 <= buf.size(), "truncated request buffer");
    r.id = RequestId(static_cast<std::uint64_t>(buf[pos]) | (static_cast<std::uint64_t>(buf[pos + 1]) << 32));
    r.hold_steps = buf[pos + 2];
    const std::size_t n = buf[pos + 3];
    pos += 4;
    KVGRID_CHECK(pos + n <= buf.size(), "truncated request buffer");
    r.tokens.assign(buf.begin() + static_cast<std::ptrdiff_t>(pos), buf.begin() + static_cast<std::ptrdiff_t>(pos + n));
    pos += n;
  }
  KVGRID_CHECK(pos == buf.size(), "request buffer has ", buf.size() - pos, " trailing words");
  return out;
}

}  // namespace kvgrid
