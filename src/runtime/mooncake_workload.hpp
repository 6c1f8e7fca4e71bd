// workload.kind = "mooncake": a Mooncake request trace (JSONL: timestamp, input_length,
// output_length, hash_ids of 512-token blocks, optional session_id) replayed in file order, each
// block's tokens made from its hash id (mooncake_block_tokens), with engine.helper_thread on a
// thread of their own ahead of their arrival and with their prefix marks (RequestSpec::prefix_marks).
#pragma once

#include <memory>

#include "runtime/serve_workload.hpp"

namespace kvgrid {

// Throws InputError naming the file and line of a bad trace.
std::unique_ptr<ServeWorkload> make_mooncake(const WorkloadConfig& w);

}  // namespace kvgrid
