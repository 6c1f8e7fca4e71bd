// Phase `forward`: the model over this rank's layers, heads and query tokens for every batch entry
// (and the plug-ins' work: on the last stage, the draft over its own pages), one stage all-reduce
// of the partial checksums. Pages loaded back from the host are read layer by layer, each after its own copy
// landed. Modelled time pipelines the layers: layer l starts when layer l-1's compute and layer
// l's copies (and gather) are done; the draft runs after the target's last layer.
#include "core/check.hpp"
#include "core/wait.hpp"
#include "runtime/cost.hpp"
#include "runtime/serve_loop.hpp"

namespace kvgrid {

void ServeLoop::forward(Step& s) {
  auto& batch = s.batch;
  std::size_t words = L_;  // per entry: the target's layers, then each plug-in's words (the draft's layers)
  for (const auto& p : plugins_) words += p->partials_per_entry();
  partials_.assign(batch.size() * words, 0);
  StepWork work;
  const std::size_t L = L_;
  if (oracle_lane_)  // the oracle's long chunks, alongside the model (verify takes them)
    for (std::size_t i = 0; i < batch.size(); ++i)
      oracle_lane_->post(i, batch[i].req->oracle, batch[i].req->spec.id, batch[i].req->tokens, batch[i].start, batch[i].end);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    auto& e = batch[i];
    auto& events = e.req->res.load_events;  // load_back: one event per (node, local layer)
    auto wait_layer = [&events, L](std::size_t l) {
      for (std::size_t k = l; k < events.size(); k += L) events[k].synchronize();
    };
    HybridTables ht;
    if (auto* h = e.req->res.hybrid.get()) {
      for (auto& ev : h->state_events) ev.synchronize();  // loaded SWA pages and MAMBA states are read below
      h->state_events.clear();
      ht = {h->swa_table, h->mamba, h->mamba_ckpt};
    }
    model_.forward(e.req->model, e.req->tokens, e.start, e.end, e.req->res.pages,
                   std::span<std::uint64_t>(partials_).subspan(i * L_, L_),
                   events.empty() ? std::function<void(std::size_t)>{} : std::function<void(std::size_t)>(wait_layer), ht);
    for (auto& ev : events) ev.synchronize();  // (all were, unless the request had no cached prefix to read)
    events.clear();
    for (std::size_t k = 0; k < plugins_.size(); ++k) plugins_[k]->forward_entry(s, i, plugin_partials(k, i, batch.size()));
    work.add(e.start, e.end, e.prefill);
  }
  if (stage_size_ > 1 && !batch.empty()) {
    MPI_Request req;
    KVGRID_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, partials_.data(), static_cast<int>(partials_.size()), MPI_UINT64_T, MPI_SUM,
                                    grid_.stage(), &req));
    wait_mpi(&req, "Iallreduce of attention checksums at step " + std::to_string(s.index));
  }
  const auto& shape = grid_.shape();
  const std::uint64_t compute = compute_ns(exp_.cost, work, L_, shape.tp, shape.cp);
  std::uint64_t plugin_ns = 0;  // the draft's passes
  for (const auto& p : plugins_) plugin_ns += p->forward_ns(s, work);
  const std::uint64_t step_ns =
      compute + plugin_ns + (stage_size_ > 1 && !batch.empty() ? static_cast<std::uint64_t>(exp_.cost.allreduce_ns) : 0);
  clock_ = s.start_ns;  // the copies' completion times enter through the layer pipeline instead
  for (std::size_t l = 0; l < L_; ++l)
    clock_ = std::max(clock_, s.layer_ready[l]) + (compute * (l + 1) / L_ - compute * l / L_);
  clock_ += step_ns - compute;
}

}  // namespace kvgrid
