#include "runtime/pd.hpp"

#include <algorithm>
#include <numeric>

#include "core/agree.hpp"
#include "core/check.hpp"
#include "core/wait.hpp"
#include "cache/hybrid_cache.hpp"
#include "protocols/cp_sharding.hpp"
#include "transfer/ordered_transport.hpp"

namespace kvgrid {

namespace {
// Transfer tags: kPdTagBase + slot × (transfer layers + sidecars) + transfer layer (the target's
// global layer, or model.layers + the draft's layer), or + transfer layers + sidecar index for a
// sidecar leg.
constexpr int kPdTagBase = 1000;
}

PdRole pd_role(const ExperimentConfig& exp, const RankGrid& grid) {
  if (grid.spec().groups.size() != 2 || exp.workload.kind == "tree") return PdRole::None;
  return grid.coord().group == 0 ? PdRole::Prefill : PdRole::Decode;
}

namespace {
// A rank's page shard in its group: N ranks along `axis`, this one owning positions ≡ rank (mod N).
struct PageShard {
  std::uint32_t n = 1, rank = 0;
  char axis = '-';  // 'c' (CP), 't' (attention-TP, MLA at CP 1) or '-' (not sharded)
};
PageShard page_shard(const ExperimentConfig& exp, const GridShape& shape, const GridCoord& c) {
  PageShard s;
  if (!protocols::shards_pages(exp.cache.cp_sharding)) return s;
  s.n = protocols::shard_group_size(shape, exp.model.attention == "mla");
  if (s.n == 1) return s;
  s.axis = shape.cp > 1 ? 'c' : 't';
  s.rank = static_cast<std::uint32_t>(shape.cp > 1 ? c.cp : c.tp);
  return s;
}
// The positions both owners hold: {i : i ≡ a.rank (mod a.n), i ≡ b.rank (mod b.n)} as a residue
// modulo lcm(a.n, b.n), or false when there is none (the residues differ modulo the gcd).
bool common_pages(const PageShard& a, const PageShard& b, std::uint32_t& mod, std::uint32_t& res) {
  mod = std::lcm(a.n, b.n);
  for (res = a.rank; res < mod; res += a.n)
    if (res % b.n == b.rank) return true;
  return false;
}
}  // namespace

bool pd_sends_draft(const ExperimentConfig& exp) {
  return exp.model.draft.enabled() && exp.model.draft.mode != "target_only";
}

std::vector<PdLeg> pd_legs(const ExperimentConfig& exp, const TopologySpec& spec, const GridCoord& me) {
  std::vector<PdLeg> legs;
  if (spec.groups.size() != 2) return legs;
  const int other = 1 - me.group;
  const GridShape& mine = spec.groups[static_cast<std::size_t>(me.group)].shape;
  const GridShape& theirs = spec.groups[static_cast<std::size_t>(other)].shape;
  const GridShape& pre = spec.groups[0].shape;
  const GridShape& dec = spec.groups[1].shape;
  const ModelGeometry g = ModelGeometry::for_rank(exp, me, mine);
  // The legs of local layer l (of geometry `mg`: the target's or the draft's) with the other
  // group's ranks of stage `stage`: its CP and TP ranks paired with this one. A replicated axis of
  // prefill has one source per decode rank (decode rank c takes prefill rank c mod prefill's
  // size); prefill's shard axis has the page's owner.
  auto pair_up = [&](const ModelGeometry& mg, std::size_t l, int stage, bool draft) {
    for (int cp = 0; cp < theirs.cp; ++cp) {
      for (int tp = 0; tp < theirs.tp; ++tp) {
        const GridCoord oc{other, tp, cp, stage, 0};
        const GridCoord& pc = me.group == 0 ? me : oc;
        const GridCoord& dc = me.group == 1 ? me : oc;
        const PageShard ps = page_shard(exp, pre, pc), ds = page_shard(exp, dec, dc);
        if (ps.axis != 'c' && dc.cp % pre.cp != pc.cp) continue;
        PdLeg leg{layout_rank(spec, other, stage, cp, tp), l, 0, 0};
        leg.draft = draft;
        if (!common_pages(ps, ds, leg.page_mod, leg.page_res)) continue;
        if (mg.mla) {  // latent KV on every TP rank: decode TP t from prefill TP t mod prefill TP
          if (ps.axis != 't' && dc.tp % pre.tp != pc.tp) continue;
          leg.head_end = 1;
        } else {  // contiguous head slices: the overlap, in this rank's head indices
          const ModelGeometry o = draft ? ModelGeometry::draft_for_rank(exp, oc, theirs) : ModelGeometry::for_rank(exp, oc, theirs);
          const std::uint32_t lo = std::max(mg.kv_heads.front(), o.kv_heads.front());
          const std::uint32_t hi = std::min(mg.kv_heads.back(), o.kv_heads.back()) + 1;
          if (lo >= hi) continue;
          leg.head_begin = lo - mg.kv_heads.front();
          leg.head_end = hi - mg.kv_heads.front();
        }
        legs.push_back(leg);
      }
    }
  };
  for (std::size_t l = 0; l < g.local_layers(); ++l) {
    const std::uint64_t gl = g.layer_begin + l;
    int stage = 0;
    while (ModelGeometry::for_rank(exp, GridCoord{other, 0, 0, stage, 0}, theirs).layer_end <= gl) ++stage;
    pair_up(g, l, stage, false);
  }
  // Speculative decoding: the draft's layers live on the last stage of each group, its heads split
  // over TP like the target's; its pages are the target's (the same suffix, the same owners).
  if (pd_sends_draft(exp) && me.pp == mine.pp - 1) {
    const ModelGeometry dg = ModelGeometry::draft_for_rank(exp, me, mine);
    for (std::size_t l = 0; l < dg.local_layers(); ++l) pair_up(dg, l, theirs.pp - 1, true);
  }
  // Sidecars: whole on every TP rank of the stage holding their source kind's first layer; decode
  // rank (tp, cp) takes prefill rank (tp mod prefill TP, cp mod prefill CP)'s words.
  for (std::size_t i = 0; i < exp.model.sidecars.size(); ++i) {
    const auto src = static_cast<std::size_t>(exp.model.sidecars[i].source);
    if (g.local_of(exp.model.sidecars[i].source) == 0 || g.kind_first[src] != 0) continue;
    const auto first = static_cast<std::uint64_t>(
        std::find(g.model_kinds.begin(), g.model_kinds.end(), exp.model.sidecars[i].source) - g.model_kinds.begin());
    int stage = 0;
    while (ModelGeometry::for_rank(exp, GridCoord{other, 0, 0, stage, 0}, theirs).layer_end <= first) ++stage;
    for (int cp = 0; cp < theirs.cp; ++cp)
      for (int tp = 0; tp < theirs.tp; ++tp) {
        const int dcp = me.group == 1 ? me.cp : cp, pcp = me.group == 0 ? me.cp : cp;
        const int dtp = me.group == 1 ? me.tp : tp, ptp = me.group == 0 ? me.tp : tp;
        if (dcp % pre.cp != pcp || dtp % pre.tp != ptp) continue;
        legs.push_back({layout_rank(spec, other, stage, cp, tp), 0, 0, 0, static_cast<int>(i)});
      }
  }
  return legs;
}

namespace {
// The KV heads [hb, he) of `layer` in the pages at prompt positions first, first + 1, ... that the
// leg carries (i ≡ page_res mod page_mod; heads are contiguous in a block). Sharded: this rank owns
// them — a page held by another owner is a placement bug, which debug checks stop here.
std::vector<transfer::Block> head_blocks(cache::KvPool& pool, std::span<const PageId> pages, std::size_t first,
                                         const PdLeg& leg) {
  std::vector<transfer::Block> blocks;
  const std::size_t per_head = pool.layer_block_bytes() / pool.heads();
  for (std::size_t k = 0; k < pages.size(); ++k) {
    if ((first + k) % leg.page_mod != leg.page_res) continue;
    KVGRID_CHECK(!KVGRID_DEBUG_CHECKS_ON() || pool.owns(pages[k]), "P/D: page ", pages[k], " at position ", first + k,
                 " is not owned by this rank (", leg.page_res, " mod ", leg.page_mod, ")");
    blocks.push_back({reinterpret_cast<std::uint8_t*>(pool.layer_block(pages[k], leg.layer)) + leg.head_begin * per_head,
                      (leg.head_end - leg.head_begin) * per_head});
  }
  return blocks;
}
}  // namespace

PdLink::PdLink(const ExperimentConfig& exp, const RankGrid& grid, cache::KvPool& pool, FailpointRegistry& faults,
               double kv_bytes_scale)
    : role_(pd_role(exp, grid)), exp_(exp), grid_(grid), pool_(pool),
      geo_(ModelGeometry::for_rank(exp, grid.coord(), grid.shape())), faults_(faults), kv_bytes_scale_(kv_bytes_scale),
      fault_rng_(rank_stream(exp.engine.seed, grid.world_rank()).fork("pd.transfer.fail.layer")) {
  if (role_ == PdRole::None) return;
  legs_ = pd_legs(exp, grid.spec(), grid.coord());
  transfer_layers_ = static_cast<std::uint64_t>(exp.model.layers + (pd_sends_draft(exp) ? exp.model.draft.layers : 0));
  leader_peer_ = role_ == PdRole::Prefill ? grid.spec().groups[0].shape.size() : 0;
  // engine.collectives: MPI's tagged point-to-point, or the ordered transport over NCCL (or over MPI
  // on one tag: its ordering layer without a GPU).
  if (exp.engine.collectives == "nccl") {
    std::vector<int> peers;
    for (const auto& leg : legs_) peers.push_back(leg.peer);
    link_ = transfer::make_ordered_transport(grid.world(), transfer::make_nccl_plane(grid.world(), std::move(peers)));
  } else if (exp.engine.collectives == "mpi_ordered") {
    link_ = transfer::make_ordered_transport(grid.world(), transfer::make_mpi_ordered_plane(grid.world()));
  } else {
    link_ = transfer::make_mpi_transport(grid.world());
  }
  for (std::int64_t s = exp.engine.max_running; s-- > 0;) free_slots_.push_back(static_cast<std::uint32_t>(s));
  next_slot_ = static_cast<std::uint32_t>(exp.engine.max_running);
  slot_limit_ = static_cast<std::uint32_t>((32767 - kPdTagBase) / (std::max<std::uint64_t>(transfer_layers_, 1) + exp.model.sidecars.size()));
  KVGRID_CHECK(next_slot_ <= slot_limit_, "P/D: ", next_slot_, " transfer slots exceed the ", slot_limit_, " MPI tags allow");
  zeros_.assign(pool.layer_block_bytes() / sizeof(std::uint64_t), 0);  // a broken leg's bytes (attach_hybrid: more)
}

void PdLink::attach_hybrid(cache::KvPool* swa_pool, cache::StatePool* states,
                           std::vector<cache::unified::PayloadSidecar*> sidecars, std::vector<SidecarConfig> specs) {
  swa_pool_ = swa_pool;
  states_ = states;
  KVGRID_CHECK(sidecars.size() == specs.size(), sidecars.size(), " sidecar payloads for ", specs.size(), " sidecars");
  sidecars_ = std::move(sidecars);
  sidecar_specs_ = std::move(specs);
  // Zeros for a broken leg: as large as its largest block (an SWA page's layer, a layer's state, a
  // sidecar's page).
  std::size_t words = zeros_.size();
  if (swa_pool) words = std::max(words, swa_pool->layer_block_bytes() / sizeof(std::uint64_t));
  if (states) words = std::max(words, states->words_per_slot());
  for (const auto* sc : sidecars_) words = std::max(words, sc->words_per_slot());
  zeros_.assign(words, 0);
}

void PdLink::attach_draft(cache::KvPool* draft_pool, cache::KvPool* draft_swa_pool, cache::StatePool* draft_states) {
  draft_pool_ = draft_pool;
  draft_swa_pool_ = draft_swa_pool;
  draft_states_ = draft_states;
  if (!draft_pool_) return;
  draft_geo_ = ModelGeometry::draft_for_rank(exp_, grid_.coord(), grid_.shape());
  std::size_t words = draft_pool_->layer_block_bytes() / sizeof(std::uint64_t);
  if (draft_swa_pool_) words = std::max(words, draft_swa_pool_->layer_block_bytes() / sizeof(std::uint64_t));
  if (draft_states_) words = std::max(words, draft_states_->words_per_slot());
  zeros_.resize(std::max(zeros_.size(), words), 0);
}

std::size_t PdLink::local_sidecar(const PdLeg& leg) const {
  for (std::size_t i = 0; i < sidecar_specs_.size(); ++i)
    if (sidecar_specs_[i].index == static_cast<std::size_t>(leg.sidecar)) return i;
  KVGRID_CHECK(false, "P/D: a leg of sidecar ", leg.sidecar, " on a rank that does not hold it");
  return 0;
}

std::size_t PdLink::tail_window_page(std::size_t dpl, std::size_t prompt) const {
  return static_cast<std::size_t>(cache::pd_swa_from(Tokens(static_cast<std::int64_t>(dpl)), Tokens(static_cast<std::int64_t>(prompt)),
                                                     Tokens(exp_.model.swa_window), exp_.cache.page_size)
                                      .value() /
                                  exp_.cache.page_size.value());
}

std::vector<PageId> PdLink::tail_window(const ServeRequest& r, std::size_t dpl) const {
  KVGRID_CHECK(r.res.hybrid != nullptr, "request ", r.spec.id, " of a hybrid model without its hybrid hold");
  const std::size_t p = static_cast<std::size_t>(exp_.cache.page_size.value());
  std::vector<PageId> pages;
  for (std::size_t i = tail_window_page(dpl, r.prompt_len()); i < (r.prompt_len() + p - 1) / p; ++i) {
    KVGRID_CHECK(r.res.hybrid->swa_table[i] != 0, "P/D: request ", r.spec.id, " holds no SWA page for page ", i, " of its tail window");
    pages.push_back(PageId(r.res.hybrid->swa_table[i]));
  }
  return pages;
}

std::vector<std::uint32_t> PdLink::sidecar_slots(const PdLeg& leg, const ServeRequest& r, std::size_t dpl) const {
  const std::size_t p = static_cast<std::size_t>(exp_.cache.page_size.value());
  const std::size_t last = (r.prompt_len() + p - 1) / p;
  std::vector<std::uint32_t> slots;
  if (sidecar_specs_[local_sidecar(leg)].source == LayerKind::Swa) {  // the tail window's SWA pages
    for (const PageId pg : tail_window(r, dpl)) slots.push_back(pg.value());
  } else {  // the suffix's FULL pages
    for (std::size_t i = dpl / p; i < last; ++i) slots.push_back(r.res.pages[i].value());
  }
  return slots;
}

std::uint64_t PdLink::global_layer(std::size_t local_layer) const {
  // (a full-attention pool's layer_base is its first layer's global id; a hybrid model's FULL
  // pool counts FULL layers only)
  return geo_.hybrid() ? geo_.layer_begin + local_layer : pool_.layer_base() + local_layer;
}

int PdLink::tag(std::uint32_t slot, const PdLeg& leg) const {
  const std::uint64_t at = leg.sidecar >= 0 ? transfer_layers_ + static_cast<std::uint64_t>(leg.sidecar) : transfer_layer(leg);
  return kPdTagBase + static_cast<int>(slot * (transfer_layers_ + exp_.model.sidecars.size()) + at);
}

std::uint64_t PdLink::transfer_layer(const PdLeg& leg) const {
  return leg.draft ? static_cast<std::uint64_t>(exp_.model.layers) + leg.layer : global_layer(leg.layer);
}

std::vector<transfer::Block> PdLink::leg_blocks(const PdLeg& leg, const ServeRequest& r, std::size_t dpl) {
  if (leg.sidecar >= 0) {  // prefill: each source page's words, read where the sidecar keeps them
    const cache::unified::PayloadSidecar& sc = *sidecars_[local_sidecar(leg)];
    std::vector<transfer::Block> blocks;
    for (const std::uint32_t s : sidecar_slots(leg, r, dpl)) {
      const auto words = sc.read(cache::unified::Slot(s));
      blocks.push_back(transfer::Block{const_cast<std::uint64_t*>(words.data()), words.size() * sizeof(std::uint64_t)});
    }
    return blocks;
  }
  if (leg.draft) {
    KVGRID_CHECK(draft_pool_ != nullptr, "P/D: a draft leg on a rank without the draft's pool");
    return layer_blocks(draft_geo_, *draft_pool_, draft_swa_pool_, draft_states_, leg, r, dpl);
  }
  return layer_blocks(geo_, pool_, swa_pool_, states_, leg, r, dpl);
}

std::vector<transfer::Block> PdLink::layer_blocks(const ModelGeometry& g, cache::KvPool& full, cache::KvPool* swa,
                                                  cache::StatePool* states, const PdLeg& leg, const ServeRequest& r,
                                                  std::size_t dpl) {
  const std::size_t p = static_cast<std::size_t>(exp_.cache.page_size.value());
  const std::size_t last = (r.prompt_len() + p - 1) / p;
  const auto suffix = [&] { return std::span<const PageId>(r.res.pages.data() + dpl / p, last - dpl / p); };
  if (!g.hybrid()) return head_blocks(full, suffix(), dpl / p, leg);
  const LayerKind kind = g.kind(leg.layer);
  std::size_t k = 0;  // the layer's index among this stage's layers of its kind (its pool's layer)
  for (std::size_t l = 0; l < leg.layer; ++l) k += g.kind(l) == kind ? 1 : 0;
  PdLeg in_pool = leg;
  in_pool.layer = k;
  if (kind == LayerKind::Full) return head_blocks(full, suffix(), dpl / p, in_pool);
  KVGRID_CHECK(r.res.hybrid != nullptr, "request ", r.spec.id, " of a hybrid model without its hybrid hold");
  const cache::HybridHold& h = *r.res.hybrid;
  if (kind == LayerKind::Swa) {
    KVGRID_CHECK(swa != nullptr, "P/D: an SWA layer without its SWA pool");
    return head_blocks(*swa, tail_window(r, dpl), tail_window_page(dpl, r.prompt_len()), in_pool);
  }
  KVGRID_CHECK(states != nullptr && h.mamba != 0, "P/D: a MAMBA layer without the request's state");
  const std::size_t S = g.mamba_state, H = g.kv_heads.size();
  auto words = states->slot(h.mamba);  // [MAMBA layer][head][word]: the leg's heads are contiguous
  return {transfer::Block{words.data() + (k * H + leg.head_begin) * S, (leg.head_end - leg.head_begin) * S * sizeof(std::uint64_t)}};
}

void PdLink::send_control(const StepMessage& m) { sender_.send(m, leader_peer_, grid_.world(), kTagPdControl); }

StepMessage PdLink::recv_control(std::int64_t step) {
  const std::string what = role_ == PdRole::Prefill ? "step " + std::to_string(step) + ": the decode leader's answers"
                                                    : "step " + std::to_string(step) + ": requests and transfers from the prefill leader";
  return recv_step(leader_peer_, grid_.world(), what, kTagPdControl);
}

PdLink::DecodeAnswers PdLink::receive_answers(std::int64_t step, std::uint64_t& clock, std::vector<PdRecord>& relay,
                                              const std::function<void(RequestId, std::uint64_t)>& finished) {
  const StepMessage d = recv_control(step);
  DecodeAnswers out{d.clock_ns, false};
  for (const auto& [kind, id, value] : d.pd) {
    if (kind == kPdAdmitted) {
      clock = std::max(clock, d.clock_ns + static_cast<std::uint64_t>(exp_.cost.pd_latency_us * 1e3));
      relay.push_back({kPdAdmitted, id, value});
      if (faults_.evaluate("pd.transfer.fail", static_cast<std::uint64_t>(step)))
        relay.push_back({kPdFault, id, fault_rng_.below(transfer_layers_)});
    }
    if (kind == kPdFinished) finished(RequestId(id), value);
    if (kind == kPdIdle) out.idle = value != 0;
  }
  return out;
}

void PdLink::send_answers(std::uint64_t clock_ns, bool idle, std::vector<PdRecord>& to_peer) {
  StepMessage d;
  d.clock_ns = clock_ns;
  d.pd = std::move(to_peer);
  d.pd.push_back({kPdIdle, 0, idle ? 1u : 0u});
  to_peer.clear();
  send_control(d);
}

PdLink::WorldTotals PdLink::world_totals(std::int64_t received_tokens, std::int64_t finished, std::int64_t failed) const {
  const bool first = grid_.world_rank() == grid_.coord().group_base;
  const bool p = first && role_ == PdRole::Prefill, d = first && role_ == PdRole::Decode;
  // Every decode rank counted its group's requests, receives and failures: they must agree
  // before the first one's count stands for the group.
  if (role_ == PdRole::Decode) {
    const std::uint64_t mine[5] = {static_cast<std::uint64_t>(received_tokens), static_cast<std::uint64_t>(stats_.failed),
                                   static_cast<std::uint64_t>(stats_.restore_failed), static_cast<std::uint64_t>(finished),
                                   static_cast<std::uint64_t>(failed)};
    if (!all_equal(grid_.group(), mine, "agreement of decode's request counts"))
      throw RunFailure("decode ranks counted different received tokens, finished or failed requests: their decisions diverged");
  }
  std::int64_t v[6] = {p ? stats_.sent_tokens : 0, d ? received_tokens : 0, d ? stats_.failed : 0,
                       d ? stats_.restore_failed : 0, d ? finished : 0, d ? failed : 0};
  agree(grid_.world(), std::span<std::int64_t>(v, 6), MPI_SUM, "all-reduce of P/D transfer counts");
  return {v[0], v[1], v[2], v[3], v[4], v[5]};
}

void PdLink::send_requests(const StepMessage& in, std::vector<PdRecord>& to_peer) {
  StepMessage p;
  p.clock_ns = in.clock_ns;
  p.exhausted = in.exhausted;
  p.total = in.total;
  p.specs = in.specs;
  p.sessions = in.sessions;  // decode holds the session references
  p.pd = std::move(to_peer);
  for (const auto a : in.aborts) p.pd.push_back({kPdAbort, a, 0});
  p.pd_stop = in.pd_stop;
  to_peer.clear();
  send_control(p);
}

void PdLink::on_prefill_records(const std::vector<PdRecord>& pd) {
  for (const auto& [kind, id, value] : pd) {
    if (kind == kPdAdmitted) boot_[id] = {value & 0xffffffffULL, static_cast<std::uint32_t>(value >> 32), ~0ULL};
    if (kind == kPdFault) boot_.at(id).breaks_at = value;
  }
}

std::vector<PdRecord> PdLink::send_suffixes(const std::vector<BatchEntry>& batch, std::uint64_t clock_ns,
                                                                std::int64_t step, bool announcer) {
  std::vector<PdRecord> out;
  const std::size_t p = static_cast<std::size_t>(exp_.cache.page_size.value());
  for (const auto& e : batch) {
    if (!e.prefill || e.end != e.req->prompt_len()) continue;
    auto it = boot_.find(e.req->spec.id.value());
    KVGRID_CHECK(it != boot_.end(), "request ", e.req->spec.id, " finished its prefill without decode's answer");
    const Boot b = it->second;
    boot_.erase(it);
    std::vector<transfer::Event> events;
    std::uint64_t bytes = 0;
    std::map<int, std::uint64_t> per_peer;  // the rank pairs' links run in parallel
    for (const auto& leg : legs_) {
      auto blocks = leg_blocks(leg, *e.req, b.dpl);
      // Broken from this layer on (a sidecar leg: whenever the transfer broke): what arrives is zeros.
      if (leg.sidecar >= 0 ? b.breaks_at < transfer_layers_ : transfer_layer(leg) >= b.breaks_at) {
        for (auto& blk : blocks) blk.data = zeros_.data();
      } else {
        for (const auto& blk : blocks) bytes += blk.bytes, per_peer[leg.peer] += blk.bytes;
      }
      events.push_back(link_->send(leg.peer, tag(b.slot, leg), blocks));
    }
    for (auto& ev : events) ev.synchronize();  // decode posted its receives when it answered
    const bool broken = b.breaks_at < transfer_layers_;
    stats_.sent_bytes += static_cast<std::int64_t>(bytes);
    if (broken) {
      ++stats_.broken;
      out.push_back({kPdBroken, e.req->spec.id.value(), b.breaks_at});
      continue;
    }
    stats_.sent_tokens += static_cast<std::int64_t>(e.req->prompt_len() - b.dpl);
    if (geo_.hybrid()) {  // by kind, once per request (each kind's legs carry the same pages or state)
      const std::int64_t last = static_cast<std::int64_t>((e.req->prompt_len() + p - 1) / p);
      if (geo_.local_of(LayerKind::Full) > 0) stats_.sent_full_pages += last - static_cast<std::int64_t>(b.dpl / p);
      if (geo_.local_of(LayerKind::Swa) > 0)
        stats_.sent_swa_pages += last - static_cast<std::int64_t>(tail_window_page(b.dpl, e.req->prompt_len()));
      if (geo_.local_of(LayerKind::Mamba) > 0) ++stats_.sent_states;
    }
    // Modelled: the busiest of this rank's pairs (the leader's legs stand for every prefill rank's).
    std::uint64_t busiest = 0;
    for (const auto& [peer, n] : per_peer) busiest = std::max(busiest, n);
    double ns = exp_.cost.pd_latency_us * 1e3 + static_cast<double>(busiest) * kv_bytes_scale_ / exp_.cost.pd_link_gb_s;
    if (announcer)
      if (auto hit = faults_.evaluate("p2p.delay", static_cast<std::uint64_t>(step))) ns += hit->param("delay_us") * 1e3;
    out.push_back({kPdSent, e.req->spec.id.value(), clock_ns + static_cast<std::uint64_t>(ns)});
  }
  return out;
}

std::vector<PdRecord> PdLink::post_receives(const std::vector<ServeRequest*>& admitted) {
  std::vector<PdRecord> out;
  for (ServeRequest* r : admitted) {
    KVGRID_CHECK(!free_slots_.empty(), "no P/D transfer slot left (engine.max_running bounds the requests in flight)");
    r->pd_slot = free_slots_.back();
    r->pd_slot_held = true;
    free_slots_.pop_back();
    const auto dpl = static_cast<std::size_t>(r->res.matched.value());
    for (const auto& leg : legs_) {
      if (leg.sidecar < 0) {
        r->pd_events.push_back(link_->recv(leg.peer, tag(r->pd_slot, leg), leg_blocks(leg, *r, dpl)));
        continue;
      }
      // A sidecar's words land beside the request and enter the sidecar when the receive ends.
      ServeRequest::PdSidecarReceive in{local_sidecar(leg), sidecar_slots(leg, *r, dpl), {}};
      const std::size_t w = sidecars_[in.sidecar]->words_per_slot();
      in.words.assign(in.slots.size() * w, 0);
      std::vector<transfer::Block> blocks;
      for (std::size_t i = 0; i < in.slots.size(); ++i) blocks.push_back(transfer::Block{in.words.data() + i * w, w * sizeof(std::uint64_t)});
      r->pd_events.push_back(link_->recv(leg.peer, tag(r->pd_slot, leg), blocks));
      r->pd_sidecars.push_back(std::move(in));  // (the words' buffer moves with it)
    }
    out.push_back({kPdAdmitted, r->spec.id.value(), dpl | (static_cast<std::uint64_t>(r->pd_slot) << 32)});
  }
  return out;
}

void PdLink::release_slot(ServeRequest& r, bool withdrawn) {
  // Once only: a slot freed twice would be handed to two requests, whose receives then share tags
  // (one request's suffix landing in the other's pages, or a size mismatch).
  if (!r.pd_slot_held) return;
  r.pd_slot_held = false;
  KVGRID_CHECK(std::find(free_slots_.begin(), free_slots_.end(), r.pd_slot) == free_slots_.end(), "P/D transfer slot ",
               r.pd_slot, " of request ", r.spec.id, " is free already");
  free_slots_.push_back(withdrawn && next_slot_ < slot_limit_ ? next_slot_++ : r.pd_slot);
  std::sort(free_slots_.begin(), free_slots_.end(), std::greater<>());  // the smallest free slot is taken next
}

void PdLink::cancel_receive(ServeRequest& r) {
  for (auto& ev : r.pd_events) ev.cancel();
  r.pd_events.clear();
  r.pd_sidecars.clear();
  release_slot(r, /*withdrawn=*/true);
}

void PdLink::finish_receive(ServeRequest& r) {
  for (auto& ev : r.pd_events) ev.synchronize();
  r.pd_events.clear();
  for (const auto& in : r.pd_sidecars) {  // (a broken transfer's zeros too: the request fails, its pages drop them)
    cache::unified::PayloadSidecar& sc = *sidecars_[in.sidecar];
    const std::size_t w = sc.words_per_slot();
    for (std::size_t i = 0; i < in.slots.size(); ++i)
      sc.write(cache::unified::Slot(in.slots[i]), std::span<const std::uint64_t>(in.words).subspan(i * w, w));
  }
  r.pd_sidecars.clear();
  release_slot(r);
}

}  // namespace kvgrid
