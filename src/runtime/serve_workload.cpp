#include "runtime/serve_workload.hpp"
#include "runtime/mooncake_workload.hpp"
#include "runtime/routed_workload.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <set>

#include "core/check.hpp"
#include "core/hash.hpp"
#include "core/rng.hpp"
#include "kernels/kv_math.hpp"

namespace kvgrid {

std::vector<TokenId> model_output(std::span<const TokenId> prompt, std::uint32_t output_len, std::uint64_t vocab) {
  std::uint64_t ph = kernels::kPrefixSeed;
  for (TokenId t : prompt) ph = kernels::prefix_hash_step(ph, t);
  std::vector<TokenId> out;
  for (std::uint32_t i = 0; i < output_len; ++i) {
    const TokenId t = kernels::next_token(ph, vocab);
    out.push_back(t);
    ph = kernels::prefix_hash_step(ph, t);
  }
  return out;
}

namespace {

std::vector<TokenId> random_tokens(Rng& rng, std::int64_t n, std::uint64_t vocab) {
  std::vector<TokenId> t(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
  for (auto& x : t) x = static_cast<TokenId>(rng.below(vocab));
  return t;
}

// Length drawn as SGLang does: uniform in [max(L * ratio, 1), L].
std::int64_t ranged(Rng& rng, std::int64_t len, double ratio) {
  const auto lo = std::max<std::int64_t>(static_cast<std::int64_t>(static_cast<double>(len) * ratio), 1);
  return lo >= len ? len : rng.between(lo, len);
}

// Conversations: each has a list of turns; turn r's prompt is the previous prompt, the model's
// output for it, then this turn's new tokens. Turn r+1 is released when turn r finishes.
class ConversationWorkload : public ServeWorkload {
 public:
  struct Conversation {
    std::vector<std::vector<TokenId>> turn_tokens;  // new tokens of each turn (turn 0: whole prompt)
    std::vector<std::uint32_t> output_len;
    std::vector<TokenId> history;                   // prompt + output of the last issued turn
    std::size_t next_turn = 0;
    bool resend_history = true;                     // false: a turn's prompt is its own tokens only
  };

  // `sessions`: conversation i is session i + 1 (opened with its first turn, closed after its last).
  ConversationWorkload(std::vector<Conversation> convs, std::uint64_t vocab, double rate, std::uint64_t seed,
                       std::int64_t max_in_flight, bool round_barrier, bool sessions = false)
      : convs_(std::move(convs)), vocab_(vocab), rng_(shared_stream(seed, "arrivals")),
        max_in_flight_(max_in_flight), round_barrier_(round_barrier), sessions_(sessions) {
    for (const auto& c : convs_) total_ += c.turn_tokens.size();
    std::uint64_t t = 0;
    for (std::size_t i = 0; i < convs_.size(); ++i) {
      ready_.push_back({t, i});
      if (rate > 0) t += static_cast<std::uint64_t>(-std::log(1.0 - rng_.uniform()) / rate * 1e9);
    }
  }

  std::vector<RequestSpec> arrivals(std::uint64_t now_ns) override {
    std::vector<RequestSpec> out;
    while (!ready_.empty() && ready_.front().first <= now_ns && admissible()) {
      auto [t, ci] = ready_.front();
      ready_.pop_front();
      Conversation& c = convs_[ci];
      const std::size_t turn = c.next_turn++;
      RequestSpec r;
      r.id = RequestId(next_id_++);
      r.arrival_ns = t;
      r.round = static_cast<std::uint32_t>(turn);
      r.output_len = c.output_len[turn];
      if (sessions_) {
        r.session = ci + 1;
        if (turn == 0) events_.push_back(SessionEvent{SessionEvent::Open, r.session});
      }
      if (c.resend_history) r.prompt = c.history;
      r.prompt.insert(r.prompt.end(), c.turn_tokens[turn].begin(), c.turn_tokens[turn].end());
      c.history = r.prompt;
      auto o = model_output(r.prompt, r.output_len, vocab_);
      c.history.insert(c.history.end(), o.begin(), o.end());
      owner_[r.id.value()] = ci;
      ++in_flight_;
      ++issued_in_round_[turn];
      out.push_back(std::move(r));
    }
    return out;
  }

  std::optional<std::uint64_t> next_arrival_ns() const override {
    if (ready_.empty() || !admissible()) return std::nullopt;
    return ready_.front().first;
  }
  bool exhausted() const override { return ready_.empty() && in_flight_ == 0 && held_.empty(); }
  std::uint64_t total_requests() const override { return total_; }

  void finished(RequestId id, std::uint64_t now_ns) override {
    auto it = owner_.find(id.value());
    KVGRID_CHECK(it != owner_.end(), "finish of unknown request ", id);
    const std::size_t ci = it->second;
    owner_.erase(it);
    --in_flight_;
    const Conversation& c = convs_[ci];
    const std::size_t done_round = c.next_turn - 1;
    ++finished_in_round_[done_round];
    if (c.next_turn < c.turn_tokens.size()) held_.push_back({now_ns, ci});
    else if (sessions_) events_.push_back(SessionEvent{SessionEvent::Close, ci + 1});
    // Without a barrier a follow-up is ready at once; with one, round r+1 waits for all of round r.
    std::deque<std::pair<std::uint64_t, std::size_t>> keep;
    for (auto& h : held_) {
      const std::size_t r = convs_[h.second].next_turn - 1;
      if (!round_barrier_ || finished_in_round_[r] == clients_in_round(r)) ready_.push_back({std::max(h.first, now_ns), h.second});
      else keep.push_back(h);
    }
    held_.swap(keep);
    std::stable_sort(ready_.begin(), ready_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  }

 private:
  bool admissible() const { return max_in_flight_ <= 0 || in_flight_ < max_in_flight_; }
  std::uint64_t clients_in_round(std::size_t r) const {
    std::uint64_t n = 0;
    for (const auto& c : convs_) n += c.turn_tokens.size() > r ? 1 : 0;
    return n;
  }

  std::vector<Conversation> convs_;
  std::uint64_t vocab_;
  Rng rng_;
  std::int64_t max_in_flight_;
  bool round_barrier_;
  bool sessions_;
  std::deque<std::pair<std::uint64_t, std::size_t>> ready_, held_;  // (ready time, conversation)
  std::map<std::uint64_t, std::size_t> owner_;
  std::map<std::size_t, std::uint64_t> issued_in_round_, finished_in_round_;
  std::int64_t in_flight_ = 0;
  std::uint64_t next_id_ = 0, total_ = 0;
};

std::unique_ptr<ServeWorkload> make_gsp(const WorkloadConfig& w, std::uint64_t seed) {
  Rng rng = shared_stream(seed, "workload.gsp");
  const auto& g = w.gsp;
  std::vector<ConversationWorkload::Conversation> convs;
  for (std::int64_t grp = 0; grp < g.groups; ++grp) {
    auto system = random_tokens(rng, ranged(rng, g.system_prompt_len, g.range_ratio), w.vocab);
    for (std::int64_t i = 0; i < g.prompts_per_group; ++i) {
      ConversationWorkload::Conversation c;
      for (std::int64_t t = 0; t < g.turns; ++t) {
        auto q = random_tokens(rng, ranged(rng, g.question_len, g.range_ratio), w.vocab);
        if (t == 0) q.insert(q.begin(), system.begin(), system.end());
        c.turn_tokens.push_back(std::move(q));
        c.output_len.push_back(static_cast<std::uint32_t>(ranged(rng, g.output_len, g.range_ratio)));
      }
      convs.push_back(std::move(c));
    }
  }
  if (!g.ordered) {
    for (std::size_t i = convs.size(); i > 1; --i) std::swap(convs[i - 1], convs[rng.below(i)]);  // Fisher-Yates
  }
  return std::make_unique<ConversationWorkload>(std::move(convs), w.vocab, w.request_rate, seed, 0, false, w.sessions);
}

// A lane: A, then B and A again `repeats` times; B starts with A's first shared_len tokens.
std::unique_ptr<ServeWorkload> make_aba(const WorkloadConfig& w, std::uint64_t seed) {
  Rng rng = shared_stream(seed, "workload.aba");
  const auto& a = w.aba;
  std::vector<ConversationWorkload::Conversation> convs;
  for (std::int64_t l = 0; l < a.lanes; ++l) {
    ConversationWorkload::Conversation c;
    c.resend_history = false;
    const auto A = random_tokens(rng, a.a_len, w.vocab);
    auto B = std::vector<TokenId>(A.begin(), A.begin() + a.shared_len);
    const auto own = random_tokens(rng, a.b_len - a.shared_len, w.vocab);
    B.insert(B.end(), own.begin(), own.end());
    c.turn_tokens.push_back(A);
    for (std::int64_t r = 0; r < a.repeats; ++r) {
      c.turn_tokens.push_back(B);
      c.turn_tokens.push_back(A);
    }
    c.output_len.assign(c.turn_tokens.size(), static_cast<std::uint32_t>(a.output_len));
    convs.push_back(std::move(c));
  }
  return std::make_unique<ConversationWorkload>(std::move(convs), w.vocab, w.request_rate, seed, 0, false, w.sessions);
}

// Every request of a group arrives with the others; nobody has its prefix yet.
std::unique_ptr<ServeWorkload> make_cold_prefix(const WorkloadConfig& w, std::uint64_t seed) {
  Rng rng = shared_stream(seed, "workload.cold_prefix");
  const auto& cp = w.cold_prefix;
  std::vector<ConversationWorkload::Conversation> convs;
  for (std::int64_t g = 0; g < cp.groups; ++g) {
    const auto prefix = random_tokens(rng, cp.prefix_len, w.vocab);
    for (std::int64_t i = 0; i < cp.requests; ++i) {
      ConversationWorkload::Conversation c;
      auto p = prefix;
      const auto suffix = random_tokens(rng, cp.suffix_len, w.vocab);
      p.insert(p.end(), suffix.begin(), suffix.end());
      c.turn_tokens.push_back(std::move(p));
      c.output_len.push_back(static_cast<std::uint32_t>(cp.output_len));
      convs.push_back(std::move(c));
    }
  }
  return std::make_unique<ConversationWorkload>(std::move(convs), w.vocab, w.request_rate, seed, 0, false, w.sessions);
}

std::unique_ptr<ServeWorkload> make_multiturn(const WorkloadConfig& w, std::uint64_t seed) {
  Rng rng = shared_stream(seed, "workload.multiturn");
  const auto& m = w.multiturn;
  const std::int64_t sub = m.sub_question_length > 0 ? m.sub_question_length : m.request_length;
  std::vector<ConversationWorkload::Conversation> convs;
  for (std::int64_t c = 0; c < m.clients; ++c) {
    ConversationWorkload::Conversation conv;
    for (std::int64_t r = 0; r < m.rounds; ++r) {
      conv.turn_tokens.push_back(random_tokens(rng, r == 0 ? m.request_length : sub, w.vocab));
      conv.output_len.push_back(static_cast<std::uint32_t>(m.output_length));
    }
    convs.push_back(std::move(conv));
  }
  return std::make_unique<ConversationWorkload>(std::move(convs), w.vocab, w.request_rate, seed, m.max_in_flight,
                                                m.round_barrier, w.sessions);
}

// Agent trajectories. Every random choice of a session comes from its own stream (seeded by the
// workload seed and the session's id), so a session's tokens never depend on when other requests
// finish; only arrival times do (a turn follows its previous one's finish, as a closed loop).
class AgenticWorkload : public ServeWorkload {
 public:
  AgenticWorkload(const AgenticConfig& cfg, std::uint64_t vocab, double rate, std::uint64_t seed)
      : cfg_(cfg), vocab_(vocab), seed_(seed) {
    Rng shared = shared_stream(seed, "workload.agentic");
    system_ = random_tokens(shared, cfg.system_prompt_len, vocab);
    Rng arrivals = shared_stream(seed, "arrivals");
    std::uint64_t t = 0;
    for (std::int64_t i = 0; i < cfg.sessions; ++i) {
      Agent a;
      a.id = static_cast<SessionId>(i + 1);
      a.rng = Rng(mix64(hash_combine(seed_, a.id)));
      a.turns_left = a.rng.between(cfg.turns_min, cfg.turns_max);
      a.sessioned = a.rng.uniform() < cfg.session_fraction;
      a.context = system_;
      auto task = random_tokens(a.rng, cfg.task_len, vocab);
      a.context.insert(a.context.end(), task.begin(), task.end());
      starts_.push_back({t, agents_.size()});
      agents_.push_back(std::move(a));
      if (rate > 0) t += static_cast<std::uint64_t>(-std::log(1.0 - arrivals.uniform()) / rate * 1e9);
    }
  }

  std::vector<RequestSpec> arrivals(std::uint64_t now_ns) override {
    std::vector<RequestSpec> out;
    last_now_ = std::max(last_now_, now_ns);
    // abandoned sessions whose client gave up by now
    while (!timers_.empty() && timers_.begin()->first <= now_ns) {
      close(timers_.begin()->second);
      timers_.erase(timers_.begin());
    }
    while (!starts_.empty() && starts_.front().first <= now_ns && active_ < cfg_.max_active) {
      auto [t, ai] = starts_.front();
      starts_.pop_front();
      ++active_;
      if (agents_[ai].sessioned) events_.push_back(SessionEvent{SessionEvent::Open, agents_[ai].id});
      ready_.insert({t, ai});
    }
    while (!ready_.empty() && ready_.begin()->first <= now_ns) {
      auto [t, ai] = *ready_.begin();
      ready_.erase(ready_.begin());
      out.push_back(issue(ai, t));
    }
    return out;
  }

  std::optional<std::uint64_t> next_arrival_ns() const override {
    std::optional<std::uint64_t> n;
    auto take = [&](std::uint64_t t) { n = n ? std::min(*n, t) : t; };
    if (!ready_.empty()) take(ready_.begin()->first);
    if (!timers_.empty()) take(timers_.begin()->first);
    if (!starts_.empty() && active_ < cfg_.max_active) take(starts_.front().first);
    return n;
  }
  bool exhausted() const override { return starts_.empty() && ready_.empty() && timers_.empty() && in_flight_.empty(); }
  // An estimate for progress rows until the trajectories are over (turns end early at max_context).
  std::uint64_t total_requests() const override {
    const auto expected = static_cast<std::uint64_t>(cfg_.sessions * (cfg_.turns_min + cfg_.turns_max) / 2);
    return exhausted() ? issued_ : std::max(issued_ + 1, expected);
  }

  void finished(RequestId id, std::uint64_t now_ns) override {
    auto it = in_flight_.find(id.value());
    KVGRID_CHECK(it != in_flight_.end(), "finish of unknown request ", id);
    last_now_ = std::max(last_now_, now_ns);
    const std::size_t ai = it->second.first;
    const std::vector<TokenId> prompt = std::move(it->second.second);
    in_flight_.erase(it);
    Agent& a = agents_[ai];
    auto o = model_output(prompt, static_cast<std::uint32_t>(cfg_.output_len), vocab_);
    a.context = prompt;
    a.context.insert(a.context.end(), o.begin(), o.end());
    a.last_output = o;
    if (a.turns_left == 0) {  // the trajectory is over
      end(ai, now_ns);
      return;
    }
    if (a.sub_ok && a.rng.uniform() < cfg_.subagent_prob) {  // a sub-agent forks from this context; we wait for it
      Agent sub;
      sub.id = (a.id << 16) | static_cast<SessionId>(++a.subs);
      sub.rng = Rng(mix64(hash_combine(seed_, sub.id)));
      sub.turns_left = cfg_.subagent_turns;
      sub.context = a.context;
      auto task = random_tokens(sub.rng, std::max<std::int64_t>(cfg_.task_len / 4, 1), vocab_);
      sub.context.insert(sub.context.end(), task.begin(), task.end());
      sub.parent = ai;
      sub.sub_ok = false;
      sub.sessioned = a.sessioned;
      a.waiting = true;
      agents_.push_back(std::move(sub));
      if (sub.sessioned) events_.push_back(SessionEvent{SessionEvent::Open, agents_.back().id});
      ready_.insert({now_ns, agents_.size() - 1});
      return;
    }
    next_turn(ai, now_ns, {});
  }

 private:
  struct Agent {
    SessionId id = 0;
    Rng rng{0};
    std::int64_t turns_left = 0;
    std::vector<TokenId> context, last_output;
    std::size_t parent = static_cast<std::size_t>(-1);
    std::uint64_t subs = 0;
    bool sub_ok = true, waiting = false, closed = false, abandoned = false, ended = false;
    bool sessioned = true;  // its client passes its session id
  };

  RequestSpec issue(std::size_t ai, std::uint64_t t) {
    Agent& a = agents_[ai];
    RequestSpec r;
    r.id = RequestId(issued_++);
    r.arrival_ns = t;
    r.session = a.sessioned ? a.id : 0;
    r.output_len = static_cast<std::uint32_t>(cfg_.output_len);
    r.prompt = a.context;
    --a.turns_left;
    if (a.turns_left == 0 && a.parent == static_cast<std::size_t>(-1) && a.sessioned && a.rng.uniform() < cfg_.abandon_prob) {
      a.abandoned = true;  // the client closes the session while this last turn still runs
      timers_.insert({t + static_cast<std::uint64_t>(cfg_.abandon_after_ms * 1e6), ai});
    }
    in_flight_[r.id.value()] = {ai, r.prompt};
    return r;
  }

  // The next turn of `ai`: its context, the extra result (a sub-agent's answer) and a tool
  // result of heavy-tailed length, after a think/tool pause — unless the context is full.
  void next_turn(std::size_t ai, std::uint64_t now_ns, std::span<const TokenId> extra) {
    Agent& a = agents_[ai];
    const double u = a.rng.uniform();
    const double len = static_cast<double>(cfg_.tool_output_min) * std::pow(1.0 - u, -1.0 / cfg_.tool_output_alpha);
    const auto tool_len = static_cast<std::int64_t>(std::min(len, static_cast<double>(cfg_.tool_output_max)));
    const auto tool = random_tokens(a.rng, tool_len, vocab_);
    const double pause = cfg_.tool_time_ms > 0 ? -std::log(1.0 - a.rng.uniform()) * cfg_.tool_time_ms * 1e6 : 0.0;
    const auto next_len = static_cast<std::int64_t>(a.context.size() + extra.size() + tool.size()) + cfg_.output_len;
    if (next_len > cfg_.max_context) {
      a.turns_left = 0;
      end(ai, now_ns);
      return;
    }
    a.context.insert(a.context.end(), extra.begin(), extra.end());
    a.context.insert(a.context.end(), tool.begin(), tool.end());
    ready_.insert({now_ns + static_cast<std::uint64_t>(pause), ai});
  }

  // The trajectory is over: a top-level session's client closes it close_delay_ms later (its slot
  // is free at once); a sub-agent's closes now (its parent waits for the answer).
  void end(std::size_t ai, std::uint64_t now_ns) {
    Agent& a = agents_[ai];
    if (a.closed) {  // abandoned: closed while its last turn ran
      if (!a.ended && a.parent == static_cast<std::size_t>(-1)) --active_;
      a.ended = true;
      return;
    }
    if (a.parent == static_cast<std::size_t>(-1) && cfg_.close_delay_ms > 0) {
      a.ended = true;
      --active_;
      timers_.insert({now_ns + static_cast<std::uint64_t>(cfg_.close_delay_ms * 1e6), ai});
      return;
    }
    close(ai);
  }

  void close(std::size_t ai) {
    Agent& a = agents_[ai];
    if (a.closed) return;
    a.closed = true;
    if (a.sessioned) events_.push_back(SessionEvent{SessionEvent::Close, a.id});
    if (a.parent != static_cast<std::size_t>(-1)) {  // a sub-agent's answer resumes its parent
      Agent& p = agents_[a.parent];
      p.waiting = false;
      const auto answer = a.last_output;
      next_turn(a.parent, last_now_, answer);
    } else if (!a.ended && !a.abandoned) {
      --active_;
      a.ended = true;
    }
  }

  AgenticConfig cfg_;
  std::uint64_t vocab_, seed_;
  std::vector<TokenId> system_;
  std::vector<Agent> agents_;
  std::deque<std::pair<std::uint64_t, std::size_t>> starts_;
  std::set<std::pair<std::uint64_t, std::size_t>> ready_, timers_;  // (time, agent)
  std::map<std::uint64_t, std::pair<std::size_t, std::vector<TokenId>>> in_flight_;  // request -> (agent, prompt)
  std::int64_t active_ = 0;
  std::uint64_t issued_ = 0, last_now_ = 0;
};

std::unique_ptr<ServeWorkload> make_whole(const WorkloadConfig& cfg, std::uint64_t seed) {
  if (cfg.kind == "gsp") return make_gsp(cfg, seed);
  if (cfg.kind == "multiturn") return make_multiturn(cfg, seed);
  if (cfg.kind == "aba") return make_aba(cfg, seed);
  if (cfg.kind == "cold_prefix") return make_cold_prefix(cfg, seed);
  if (cfg.kind == "agentic") return std::make_unique<AgenticWorkload>(cfg.agentic, cfg.vocab, cfg.request_rate, seed);
  KVGRID_CHECK(cfg.kind == "mooncake", "no serving workload '", cfg.kind, "'");
  return make_mooncake(cfg);
}
}  // namespace

std::unique_ptr<ServeWorkload> make_serve_workload(const WorkloadConfig& cfg, std::uint64_t seed) {
  return route_by_length(make_whole(cfg, seed), cfg);  // buckets by context length, if asked
}

}  // namespace kvgrid
