#include "runtime/scheduler.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "kernels/kv_math.hpp"
#include "protocols/layer_gather.hpp"

namespace kvgrid {

Scheduler::Scheduler(SchedulerConfig cfg, cache::DeviceCache& cache) : cfg_(cfg), vocab_(cfg_.vocab), cache_(cache) {}

void Scheduler::enqueue(RequestSpec spec, std::uint64_t wall_ns) {
  KVGRID_CHECK(!spec.prompt.empty() && spec.output_len >= 1, "request ", spec.id, " with an empty prompt or no output");
  auto r = std::make_unique<ServeRequest>();
  r->prompt_len_ = spec.prompt.size();
  r->tokens = std::move(spec.prompt);  // the prompt's only copy (a workload may have reserved room for the output)
  r->tokens.reserve(r->prompt_len_ + spec.output_len);  // (its generated tokens append without a move)
  r->model.marks = std::move(spec.prefix_marks);
  r->model.mark_stride = spec.mark_stride;
  r->spec = std::move(spec);
  r->spec.prompt.clear();
  r->ph = kernels::kPrefixSeed;
  r->seen_wall_ns = wall_ns;
  cache_.on_arrival(r->spec.id, r->prompt());
  waiting_.push_back(std::move(r));
}

std::vector<BatchEntry> Scheduler::schedule(std::uint64_t now_ns) {
  std::vector<BatchEntry> batch;
  fresh_pages_.clear();
  admitted_.clear();
  const std::int64_t p = cache_.tree().page_size().value();
  // P/D decode over a sharded pool: a request's first decode step reads its whole received prompt
  // through the layer gather, and the batch's first steps share one slot (the rest wait a step).
  const bool decode_gathers = cfg_.receive_prompt && cfg_.gather_pages > 0;
  auto prompt_slot_pages = [&](const ServeRequest& r) {
    return protocols::LayerGather::padded_pages((static_cast<std::int64_t>(r.prompt_len()) + p - 1) / p, cfg_.shards);
  };
  std::int64_t first_steps = 0;
  // Hybrid models: a request runs a step only with SWA pages for what it computes (else it sits
  // the step out); `stalled` counts those, to tell a pool that can never serve them.
  std::size_t stalled = 0;
  auto ready = [&](ServeRequest& r, std::size_t end) {
    if (cache_.prepare(r.spec.id, r.res, Tokens(static_cast<std::int64_t>(end)))) return true;
    ++stalled;
    return false;
  };
  for (auto& r : running_) {
    if (!r->prefill_done() || r->finished() || r->awaiting_kv || r->awaiting_restore) continue;
    if (decode_gathers && !r->model.primed) {
      const std::int64_t want = prompt_slot_pages(*r);
      if (first_steps > 0 && first_steps + want > cfg_.gather_pages) continue;  // the slot is full: next step
      first_steps += want;
    }
    if (!ready(*r, r->tokens.size())) continue;
    batch.push_back({r.get(), r->computed, r->tokens.size(), false});
  }
  std::int64_t budget = cfg_.chunk_size;
  for (auto& r : running_) {
    if (r->prefill_done() || r->awaiting_kv || r->awaiting_restore || budget <= 0) continue;
    const auto take = std::min<std::int64_t>(static_cast<std::int64_t>(r->prompt_len() - r->computed), budget);
    if (!ready(*r, r->computed + static_cast<std::size_t>(take))) continue;
    batch.push_back({r.get(), r->computed, r->computed + static_cast<std::size_t>(take), true});
    budget -= take;
  }
  std::int64_t gather_used = 0;  // slot pages of this step's admissions (CP sharding)
  while (budget > 0 && !waiting_.empty() && static_cast<std::int64_t>(running_.size()) < cfg_.max_running) {
    ServeRequest& w = *waiting_.front();
    if (!cache_.prefetch_ready(w.spec.id)) break;  // its storage prefetch goes on (stop policy)
    if (cfg_.admit_gate && !cfg_.admit_gate(w.spec.id)) break;  // P/D prefill: not bootstrapped yet
    Tokens max_match(cfg_.receive_prompt && !cfg_.reuse ? 0 : INT64_MAX);
    if (decode_gathers && prompt_slot_pages(w) > cfg_.gather_pages)
      throw RunFailure("request " + std::to_string(w.spec.id.value()) + ": its prompt of " + std::to_string(w.prompt_len()) +
                       " tokens needs " + std::to_string(prompt_slot_pages(w)) + " pages of a gather slot of " +
                       std::to_string(cfg_.gather_pages) + ": decode could never read it (raise cache.gather_pages)");
    if (cfg_.gather_pages > 0 && !cfg_.receive_prompt) {
      const std::int64_t want = protocols::LayerGather::padded_pages(cache_.peek_hit(w.prompt()).value() / p, cfg_.shards);
      if (gather_used > 0 && gather_used + want > cfg_.gather_pages) break;  // the slot is full: next step
      max_match = Tokens((cfg_.gather_pages - gather_used) / cfg_.shards * cfg_.shards * p);
    }
    auto res = cache_.reserve(w.spec.id, w.prompt(), Tokens(static_cast<std::int64_t>(w.kv_len())), max_match);
    if (!res) {
      // Head of line waits for pages — unless it can never have them: nothing runs that could
      // free any, and the pool (per owner, when sharded) is smaller than what it needs.
      const std::int64_t need = (static_cast<std::int64_t>(w.kv_len()) + p - 1) / p;
      const auto& pool = cache_.pool();
      const std::int64_t n = pool.shards(), per_owner = pool.capacity().value() / n;
      if (running_.empty() && (need + n - 1) / n > per_owner)
        throw RunFailure("request " + std::to_string(w.spec.id.value()) + " needs " + std::to_string(need) +
                         " device pages (" + std::to_string(w.kv_len()) + " tokens) but the device pool holds " +
                         std::to_string(per_owner) + (n > 1 ? " per owner" : "") +
                         ": it can never be admitted (raise cache.device_pages" +
                         (n > 1 ? ", or lower cache.gather_pages" : "") + ")");
      // Nothing holds anything (no request, no backup in flight): eviction freed all it could.
      const bool writing = cache_.write_acks() && cache_.write_acks()->unpublished() > 0;
      if (running_.empty() && cache_.hybrid() && !writing && !cache_.hybrid()->last_refusal_injected())
        throw RunFailure("request " + std::to_string(w.spec.id.value()) + " (" + std::to_string(w.kv_len()) +
                         " tokens) cannot be admitted even with nothing running: " + cache_.hybrid()->last_refusal() +
                         " (raise cache.swa_pages, cache.mamba_slots or cache.device_pages, or lower engine.chunk_size)");
      break;
    }
    if (cfg_.gather_pages > 0 && !cfg_.receive_prompt)
      gather_used += protocols::LayerGather::padded_pages(res->matched.value() / p, cfg_.shards);
    w.res = std::move(*res);
    w.computed = static_cast<std::size_t>(w.res.matched.value());
    w.admit_ns = now_ns;
    fresh_pages_.insert(fresh_pages_.end(), w.res.pages.end() - w.res.fresh.value(), w.res.pages.end());
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    admitted_.push_back(&w);
    if (cfg_.receive_prompt) {  // P/D decode: the prompt's KV comes from prefill, nothing to compute
      w.awaiting_kv = true;
      continue;
    }
    if (w.res.restore_pending()) {  // its load-back's outcome is agreed before anyone reads it
      w.awaiting_restore = true;
      continue;
    }
    const auto take = std::min<std::int64_t>(static_cast<std::int64_t>(w.prompt_len() - w.computed), budget);
    if (!ready(w, w.computed + static_cast<std::size_t>(take))) break;  // admitted; it starts when it has SWA pages
    batch.push_back({&w, w.computed, w.computed + static_cast<std::size_t>(take), true});
    budget -= take;
  }
  // (Backups in flight hold tree pages that their ACKs release: not stalled for good.)
  const bool writing = cache_.write_acks() && cache_.write_acks()->unpublished() > 0;
  if (batch.empty() && stalled > 0 && stalled == running_.size() && !writing)
    throw RunFailure("every running request waits for SWA pages and none can be freed: cache.swa_pages cannot hold the "
                     "windows of " + std::to_string(stalled) + " running requests (raise cache.swa_pages or lower "
                     "engine.max_running)");
  return batch;
}

std::optional<BatchEntry> Scheduler::quiet_decode() {
  if (running_.size() != 1 || cache_.hybrid()) return std::nullopt;
  if (!waiting_.empty() && static_cast<std::int64_t>(running_.size()) < cfg_.max_running) return std::nullopt;
  ServeRequest& r = *running_.front();
  if (!r.prefill_done() || r.awaiting_kv || r.awaiting_restore || r.generated + 1 >= r.spec.output_len) return std::nullopt;
  if (cfg_.receive_prompt && cfg_.gather_pages > 0 && !r.model.primed) return std::nullopt;
  fresh_pages_.clear();
  admitted_.clear();
  return BatchEntry{&r, r.computed, r.tokens.size(), false};
}

ServeRequest* Scheduler::find_running(RequestId id) {
  for (auto& r : running_)
    if (r->spec.id == id) return r.get();
  return nullptr;
}

void Scheduler::kv_arrived(RequestId id, std::uint64_t now_ns, std::uint64_t wall_ns) {
  ServeRequest* r = find_running(id);
  KVGRID_CHECK(r != nullptr && r->awaiting_kv, "request ", id, " is not waiting for its KV");
  r->awaiting_kv = false;
  r->computed = r->prompt_len();
  hash_through(*r, r->computed);
  r->generated = 1;  // the prefill's first token
  r->first_token_ns = now_ns;
  r->first_token_wall_ns = wall_ns;
  if (!r->finished()) r->tokens.push_back(next_token(r->ph));
}

void Scheduler::accept_draft(RequestId id, std::uint32_t n) {
  for (auto& r : running_) {
    if (r->spec.id != id) continue;
    KVGRID_CHECK(r->prefill_done() && r->generated + n < r->spec.output_len && r->tokens.size() == r->computed + 1,
                 "request ", id, " cannot accept ", n, " draft tokens (", r->generated, " of ", r->spec.output_len, " generated)");
    for (std::uint32_t i = 0; i < n; ++i) {  // the draft proposed exactly what the target generates
      hash_through(*r, r->tokens.size());
      r->tokens.push_back(next_token(r->ph));
      r->generated += 1;
    }
    return;
  }
}

std::unique_ptr<ServeRequest> Scheduler::abort(RequestId id) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if ((*it)->spec.id != id) continue;
    auto r = std::move(*it);
    waiting_.erase(it);
    cache_.abort_waiting(id);
    return r;
  }
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if ((*it)->spec.id != id) continue;
    auto r = std::move(*it);
    running_.erase(it);
    cache_.abort(id, r->res);
    return r;
  }
  return nullptr;
}

std::vector<RequestId> Scheduler::ids() const {
  std::vector<RequestId> out;
  for (const auto& r : waiting_) out.push_back(r->spec.id);
  for (const auto& r : running_) out.push_back(r->spec.id);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::unique_ptr<ServeRequest>> Scheduler::complete_step(const std::vector<BatchEntry>& batch,
                                                                   std::uint64_t now_ns, std::uint64_t wall_ns) {
  for (const auto& e : batch) {
    ServeRequest& r = *e.req;
    r.computed = e.end;
    cache_.advance(r.res, Tokens(static_cast<std::int64_t>(e.start)), Tokens(static_cast<std::int64_t>(e.end)), !e.prefill);
    if (e.prefill) cache_.insert_computed(r.spec.id, r.res, std::span<const TokenId>(r.tokens).first(r.computed));
    if (e.prefill && !r.prefill_done()) continue;
    // The prefill finished (first token) or a decode step ran: one more token.
    if (r.ph_len < r.computed && r.model.hashed == r.computed) {  // the forward hashed these very tokens
      r.ph = r.model.ph;
      r.ph_len = r.computed;
    }
    hash_through(r, r.computed);
    const TokenId t = next_token(r.ph);
    r.generated += 1;
    if (r.generated == 1) {
      r.first_token_ns = now_ns;
      r.first_token_wall_ns = wall_ns;
    }
    if (!r.finished()) r.tokens.push_back(t);  // the last token's KV is never computed
  }
  std::vector<std::unique_ptr<ServeRequest>> done;
  for (auto& r : running_) {
    if (!r->finished() || r->awaiting_kv || r->awaiting_restore) continue;
    KVGRID_CHECK(r->computed == r->kv_len() && r->tokens.size() == r->kv_len(), "request ", r->spec.id, " finished with ",
                 r->computed, " positions computed of ", r->kv_len());
    cache_.commit(r->spec.id, r->res, r->tokens, cache::SessionTag{r->spec.session, r->spec.session_gen});
    r->finish_ns = now_ns;
    done.push_back(std::move(r));
  }
  running_.erase(std::remove(running_.begin(), running_.end(), nullptr), running_.end());
  return done;
}

}  // namespace kvgrid
