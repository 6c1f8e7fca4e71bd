// Phase `gather` (transfers and gathers): when each local layer's inputs are ready, modelled —
// layer l's load-back copies of every request in the batch — and, with CP-sharded pools, the
// layer gather of the cached prefixes of requests computed here for the first time
// (protocols/layer_gather.hpp: restore(l) → gather(l) → attention(l)). Modelled: layer l's gather
// starts when its restores and the previous layer's gather are done, attention on layer l waits
// for it, and the next layer's gather overlaps this layer's attention.
#include "runtime/serve_loop.hpp"

namespace kvgrid {

void ServeLoop::gather(Step& s) {
  s.layer_ready.assign(L_, 0);
  for (auto& e : s.batch) {
    for (std::size_t i = 0; i < e.req->res.load_events.size(); ++i)
      s.layer_ready[i % L_] = std::max(s.layer_ready[i % L_], e.req->res.load_events[i].complete_ns());
    if (const auto* h = e.req->res.hybrid.get())  // loaded SWA pages and MAMBA states: before the first layer
      for (const auto& ev : h->state_events) s.layer_ready[0] = std::max(s.layer_ready[0], ev.complete_ns());
  }
  s.start_ns = clock_;
  protocols::LayerGather* lg = stack_.gather.get();
  if (!lg) return;
  std::vector<protocols::GatherItem> items;
  std::vector<ServeRequest*> primed;
  const std::size_t ps = static_cast<std::size_t>(exp_.cache.page_size.value());
  for (auto& e : s.batch)
    if (!e.req->model.primed && e.start > 0) {
      model_.prime_for_gather(e.req->model);
      const std::size_t n = (e.start + ps - 1) / ps;  // (P/D decode: the whole received prompt, its last page partial)
      items.push_back({std::span<const PageId>(e.req->res.pages).first(n), e.req->model.run, e.start % ps});
      primed.push_back(e.req);
    }
  if (items.empty()) return;
  const std::size_t L = L_;
  auto wait_layer = [&primed, L](std::size_t l) {
    for (auto* r : primed)
      for (std::size_t k = l; k < r->res.load_events.size(); k += L) r->res.load_events[k].synchronize();
  };
  const std::uint64_t bytes = lg->run(items, wait_layer);
  const auto g_ns = static_cast<std::uint64_t>(exp_.cost.gather_latency_us * 1e3 +
                                               static_cast<double>(bytes) * stack_.kv_bytes_scale / exp_.cost.gather_gb_s);
  std::uint64_t prev = clock_;
  const std::uint64_t first = std::max(clock_, s.layer_ready[0]);
  for (std::size_t l = 0; l < L_; ++l) {
    prev = std::max(prev, s.layer_ready[l]) + g_ns;
    s.layer_ready[l] = prev;
  }
  gather_ns_ += g_ns * L_;
  // Like a copy: modelled start of layer 0's gather, end of the last layer's, bytes per layer.
  emit(s.index, static_cast<std::uint64_t>(items.size()), "gather", static_cast<std::int64_t>(first),
       static_cast<std::int64_t>(prev), static_cast<std::int64_t>(bytes), 0);
}

}  // namespace kvgrid
