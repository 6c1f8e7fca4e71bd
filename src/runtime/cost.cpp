// Cost constants (defaults of [cost]) and where each comes from. The reference point is an
// 8-billion-parameter dense model (32 layers, hidden size 4096) on one H100-class GPU with about
// 400 TFLOP/s of usable dense BF16 compute and 3.35 TB/s of HBM bandwidth (the SXM H100's
// datasheet figures, derated for the dense compute).
//
//  prefill_ns_per_token_layer = 1250: a forward pass costs 2 FLOP per parameter per token,
//      2 × 8e9 = 1.6e10 FLOP per token, over 32 layers 5e8 FLOP per token per layer;
//      5e8 / 4e14 FLOP/s = 1.25 µs.
//  attention_ns_per_context_token_layer = 0.041: QK^T and PV cost 4 × hidden = 16,384 FLOP per
//      (query, context) pair per layer; 16,384 / 4e14 = 0.041 ns.
//  decode_ns_per_layer = 150000: decode is bound by reading the weights once per step:
//      16 GB of BF16 weights / 3.35 TB/s = 4.8 ms per step, 150 µs per layer.
//  pp_link_ns = 10000 and allreduce_ns = 20000: latencies of a small NVLink message and of a
//      small all-reduce among 8 GPUs (order of magnitude from NCCL's all_reduce_perf small-size
//      rows), charged once per hop and per step.
//  gather_gb_s = 200 and gather_latency_us = 10 (CP-sharded KV, per layer): NVLink 4 moves
//      450 GB/s per H100 and direction; large all-gathers reach a bus bandwidth of roughly
//      350 GB/s in nccl-tests, and per-layer messages of a few MiB get about half of that; the
//      latency is a small collective's, the same order as allreduce_ns. Charged as
//      latency + received bytes / bandwidth for each layer.
//
// Work splits over TP and CP ranks (each computes 1/(TP·CP) of the prefill); decode weight reads
// split over TP only.
#include "runtime/cost.hpp"

namespace kvgrid {

std::uint64_t compute_ns(const CostConfig& c, const StepWork& w, std::size_t layers, int tp, int cp) {
  const double split = static_cast<double>(tp) * static_cast<double>(cp);
  const double l = static_cast<double>(layers);
  double ns = static_cast<double>(w.prefill_tokens) * c.prefill_ns_per_token_layer * l / split +
              static_cast<double>(w.attention_pairs) * c.attention_ns_per_context_token_layer * l / split;
  if (w.decode_tokens > 0) ns += c.decode_ns_per_layer * l / static_cast<double>(tp);
  return static_cast<std::uint64_t>(ns);
}

}  // namespace kvgrid
