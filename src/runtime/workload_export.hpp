// `kvgrid workload EXP --export FILE`: an experiment's serving workload written as a Mooncake JSONL
// trace, so that the same requests (lengths, arrivals, which prompts share which prefixes) can be
// replayed on a real serving system or fed back to kvgrid as `workload.kind = "mooncake"`.
//
// One line per request in arrival order: {"timestamp": ms, "input_length": tokens,
// "output_length": tokens, "hash_ids": [...]}. hash_ids name the prompt's 512-token blocks (the last
// may be partial) by their whole prefix: two prompts get the same id for block b exactly when their
// first (b + 1) · 512 tokens (or, for a partial last block, all their tokens) are equal; ids are
// numbered 0, 1, ... in order of first appearance.
//
// Closed-loop workloads (gsp turns, multiturn) release a follow-up when its predecessor finishes,
// which depends on the serving system; here every request is taken to finish `service_ns` after it
// arrives (the export's one modelling assumption, printed with it).
#pragma once

#include <cstdint>
#include <string>

#include "runtime/experiment.hpp"

namespace kvgrid {

struct WorkloadExport {
  std::string jsonl;  // the trace, one line per request
  std::uint64_t requests = 0, prompt_tokens = 0, output_tokens = 0;
  std::uint64_t blocks = 0, distinct_blocks = 0;  // block references and distinct block ids
  std::uint64_t last_arrival_ns = 0;
};

// Throws InputError for a workload the serving loop has no generator for (kind = "tree").
WorkloadExport export_workload(const ExperimentConfig& exp, std::uint64_t service_ns);

}  // namespace kvgrid
