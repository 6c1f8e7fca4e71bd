#include "runtime/spec_decode.hpp"

#include <mpi.h>

#include <algorithm>

#include "core/agree.hpp"
#include "core/check.hpp"
#include "core/hash.hpp"
#include "core/wait.hpp"

namespace kvgrid {

std::int64_t draft_round_size(const DraftConfig& d, const BatchEntry& e) {
  const bool yields = !e.prefill || e.end == e.req->prompt_len();
  if (!d.enabled() || !yields) return 0;
  const auto g1 = static_cast<std::int64_t>(e.req->generated) + 1;  // tokens generated once this step's is
  return std::min<std::int64_t>(d.steps, static_cast<std::int64_t>(e.req->spec.output_len) - g1 - 1);
}

std::uint32_t draft_accepted(std::uint64_t seed, RequestId id, std::uint32_t generated, std::int64_t k, double accept_prob,
                             bool intact) {
  std::uint32_t a = 0;
  for (; intact && a < k; ++a) {
    const std::uint64_t x = mix64(hash_combine(hash_combine(hash_combine(seed, 0x7370656364726166ULL), id.value()),
                                               static_cast<std::uint64_t>(generated) * 1024 + a));
    if (static_cast<double>(x >> 11) * 0x1.0p-53 >= accept_prob) break;
  }
  return a;
}

std::uint64_t draft_step_ns(const CostConfig& c, const DraftConfig& d, const StepWork& work, std::span<const BatchEntry> batch,
                            std::size_t draft_layers, int tp, int cp) {
  if (batch.empty()) return 0;
  std::uint64_t ns = compute_ns(c, work, draft_layers, tp, cp);
  if (work.decode_tokens > 0 || std::any_of(batch.begin(), batch.end(), [](const BatchEntry& e) { return e.end == e.req->prompt_len(); }))
    ns += static_cast<std::uint64_t>(static_cast<double>(d.steps - 1) * c.decode_ns_per_layer * static_cast<double>(draft_layers) /
                                     static_cast<double>(tp));
  return ns;
}

void share_spec_counts(const RankGrid& grid, ServeResult& res) {
  std::uint64_t v[5] = {static_cast<std::uint64_t>(res.spec_rounds), static_cast<std::uint64_t>(res.spec_proposed),
                        static_cast<std::uint64_t>(res.spec_accepted), static_cast<std::uint64_t>(res.draft_mismatches),
                        res.spec_digest};
  // The last stage verified the rounds: every rank of it must have counted the same, then the
  // world takes its leader's counts (the other stages hold none; in a P/D world each group's last
  // stage counts its own: decode's rounds, and prefill's checks of the draft over the prompts).
  if (grid.is_last_stage() && !all_equal(grid.stage(), std::span<const std::uint64_t>(v, 5), "agreement of draft counts"))
    throw RunFailure("the last stage's ranks counted different draft rounds or acceptances: their verification diverged");
  if (!grid.is_last_stage() || !grid.is_stage_leader()) std::fill(v, v + 5, 0);
  agree(grid.world(), std::span<std::uint64_t>(v, 5), MPI_SUM, "all-reduce of speculative decoding counts");
  res.spec_rounds = static_cast<std::int64_t>(v[0]);
  res.spec_proposed = static_cast<std::int64_t>(v[1]);
  res.spec_accepted = static_cast<std::int64_t>(v[2]);
  res.draft_mismatches = static_cast<std::int64_t>(v[3]);
  res.spec_digest = v[4];
}

}  // namespace kvgrid

namespace kvgrid {

SpecDecodeStep::SpecDecodeStep(Context ctx)
    : exp_(ctx.exp),
      grid_(ctx.grid),
      sched_(ctx.sched),
      clock_(ctx.clock),
      res_(ctx.res),
      draft_pool_(ctx.draft_pool),
      draft_gather_(ctx.draft_gather),
      kv_bytes_scale_(ctx.kv_bytes_scale),
      emit_(std::move(ctx.emit)),
      Ld_(ctx.draft_geo ? ctx.draft_geo->local_layers() : 0) {
  if (ctx.draft_geo) {
    model_ = std::make_unique<SyntheticModel>(*ctx.draft_geo, *draft_pool_, exp_.cache.page_size);
    if (ctx.draft_geo->hybrid()) model_->attach_hybrid(ctx.draft_swa_pool, ctx.draft_states);
    oracle_ = std::make_unique<Oracle>(*ctx.draft_geo, exp_.cache.page_size);
  }
}

void SpecDecodeStep::leader_before_arrivals(ServeStep& s) { receive_back(s); }

void SpecDecodeStep::receive_back(ServeStep& s) {
  if (!expect_back_ || grid_.shape().pp == 1 || back_received_) return;
  // The last stage verified the previous step's drafts: their accepted counts decide this step's
  // decode lengths (a real pipeline waits for its sampled tokens the same way).
  StepMessage back = recv_step(grid_.shape().pp - 1, grid_.pp(),
                               "step " + std::to_string(s.index) + " inputs: drafts verified by the last stage", kTagBackward);
  s.in.accepts = std::move(back.accepts);
  const std::uint64_t at = back.clock_ns + static_cast<std::uint64_t>(exp_.cost.pp_link_ns);
  clock_ = std::max(clock_, at);
  // (P/D decode: the inputs, prefill's clock in them, are set already; the stage's broadcast
  // carries this wait to the leader's peers. Elsewhere leader_inputs sets in.clock_ns after this.)
  s.in.clock_ns = std::max(s.in.clock_ns, at);
  back_received_ = true;
}

void SpecDecodeStep::first_stage_inputs(ServeStep& s) {
  if (grid_.shape().pp == 1) s.in.accepts = accepts_next_;  // every rank of the one stage verified them
  // P/D decode: the inputs came whole from prefill (no arrivals drawn here), the counts come now.
  if (grid_.is_stage_leader()) receive_back(s);
  back_received_ = false;
}

void SpecDecodeStep::after_aborts(ServeStep& s) {
  // Accepted draft tokens of the previous step's rounds (every stage, same order).
  if (model_ && grid_.shape().pp > 1)
    KVGRID_CHECK(s.in.accepts == accepts_next_, "step ", s.index, ": the accepted drafts relayed from PP0 differ from this stage's");
  for (const auto& [id, n] : s.in.accepts) sched_.accept_draft(RequestId(id), static_cast<std::uint32_t>(n));
}

void SpecDecodeStep::scheduled(ServeStep& /*s*/) {
  if (draft_pool_) draft_pool_->reset(sched_.fresh_pages());
  gather_ns_ = 0;
}

void SpecDecodeStep::gather_draft(ServeStep& s) {
  std::vector<protocols::GatherItem> items;
  const std::size_t ps = static_cast<std::size_t>(exp_.cache.page_size.value());
  for (auto& e : s.batch)
    if (!e.req->draft.primed && e.start > 0) {
      model_->prime_for_gather(e.req->draft);
      const std::size_t n = (e.start + ps - 1) / ps;
      items.push_back({std::span<const PageId>(e.req->res.pages).first(n), e.req->draft.run, e.start % ps});
    }
  if (items.empty()) return;
  const std::uint64_t bytes = draft_gather_->run(items, {});
  // Modelled: one gather per draft layer, after the target's (the draft runs after its last layer).
  gather_ns_ = static_cast<std::uint64_t>(static_cast<double>(Ld_) * (exp_.cost.gather_latency_us * 1e3 +
                                                                      static_cast<double>(bytes) * kv_bytes_scale_ / exp_.cost.gather_gb_s));
  emit_(s.index, static_cast<std::uint64_t>(items.size()), "draft_gather", static_cast<std::int64_t>(Ld_),
        static_cast<std::int64_t>(gather_ns_), static_cast<std::int64_t>(bytes), 0);
}

void SpecDecodeStep::forward_entry(ServeStep& s, std::size_t i, std::span<std::uint64_t> partials) {
  if (!model_) return;
  if (i == 0 && draft_gather_) gather_draft(s);
  auto& e = s.batch[i];  // the draft reads its own pages (restored with the target's, or not)
  HybridTables ht;  // a hybrid draft: its SWA pages and states sit at the target's ids
  if (const auto* h = e.req->res.hybrid.get()) ht = {h->swa_table, h->mamba, h->mamba_ckpt};
  model_->forward(e.req->draft, e.req->tokens, e.start, e.end, e.req->res.pages, partials, {}, ht);
}

std::uint64_t SpecDecodeStep::forward_ns(const ServeStep& s, const StepWork& work) const {
  if (!model_) return 0;
  const auto& shape = grid_.shape();
  return gather_ns_ + draft_step_ns(exp_.cost, exp_.model.draft, work, s.batch, Ld_, shape.tp, shape.cp);
}

void SpecDecodeStep::verify_entry(ServeStep& s, std::size_t i, std::span<const std::uint64_t> partials) {
  auto& e = s.batch[i];
  const std::int64_t k = draft_round_size(exp_.model.draft, e);
  if (k > 0) ++s.rounds_started;
  if (!model_) return;
  const std::uint64_t got = chain(chain_seed(e.req->spec.id, e.start, e.end, /*draft=*/true), partials);
  const bool intact = got == oracle_->expected(e.req->draft_oracle, e.req->spec.id, e.req->tokens, e.start, e.end);
  if (!intact) {
    ++e.req->draft_mismatches;
    emit_(s.index, e.req->spec.id.value(), "draft_mismatch", static_cast<std::int64_t>(e.start), static_cast<std::int64_t>(e.end), 0, 0);
  }
  if (k <= 0) return;
  const std::uint32_t a =
      draft_accepted(exp_.engine.seed, e.req->spec.id, e.req->generated + 1, k, exp_.model.draft.accept_prob, intact);
  ++e.req->spec_rounds;
  e.req->spec_proposed += static_cast<std::uint32_t>(k);
  e.req->spec_accepted += a;
  s.accepts.push_back({e.req->spec.id.value(), a});
  emit_(s.index, e.req->spec.id.value(), "draft_round", k, a, intact ? 1 : 0, 0);
}

void SpecDecodeStep::message(ServeStep& s) { s.out.accepts = s.in.accepts; }

void SpecDecodeStep::end_of_step(ServeStep& s) {
  accepts_next_ = std::move(s.accepts);
  expect_back_ = s.rounds_started > 0;
  KVGRID_CHECK(!model_ || accepts_next_.size() == s.rounds_started, "draft rounds: ", accepts_next_.size(), " verified of ",
               s.rounds_started);
}

void SpecDecodeStep::finished(ServeRequest& r) {
  res_.spec_rounds += r.spec_rounds;
  res_.spec_proposed += r.spec_proposed;
  res_.spec_accepted += r.spec_accepted;
  res_.draft_mismatches += r.draft_mismatches;
  if (model_) res_.spec_digest += mix64(hash_combine(hash_combine(r.spec.id.value(), r.spec_rounds), r.spec_accepted));
}

void SpecDecodeStep::after_step(ServeStep& /*s*/) {
  if (!model_ || grid_.shape().pp == 1 || !grid_.is_stage_leader() || !expect_back_) return;
  StepMessage back;
  back.clock_ns = clock_;
  back.accepts = accepts_next_;
  back_sender_.send(back, 0, grid_.pp(), kTagBackward);
}

}  // namespace kvgrid
