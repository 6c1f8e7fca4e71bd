// The `cuda` transfer backend (engine.transfer = cuda): the TransferEngine interface
// (transfer/transfer_engine.hpp) over CUDA streams and events.
//
//  * one non-blocking CUDA stream per kvgrid stream (FIFO per stream, as the interface requires);
//  * a batch's completion is a CUDA event recorded after its copies: query() is cudaEventQuery,
//    synchronize() is cudaEventSynchronize;
//  * a batch of copies goes out one of three ways (engine.cuda_copy):
//      memcpy — one cudaMemcpyAsync per copy (cudaMemcpyDefault: the pointers say the direction);
//      kernel — one launch of the copy kernel per 128 copies, the copy list passed by value (no
//               staging buffer whose lifetime could outlast the launch); needs device-accessible
//               memory on both sides, so a batch touching pageable memory falls back to memcpy;
//      batch  — the toolkit's cudaMemcpyBatchAsync, the whole batch in one call;
//    the copy benchmark measures all three against a plain cudaMemcpyAsync of the same bytes;
//  * inject(delay, fail) applies to the next batch: a delay is a kernel that spins on the GPU's
//    global timer before the copies (the stream stays FIFO, so everything after waits too); a
//    failure records the event without copying and marks it failed.
// Depends on the CUDA runtime only (with the header-only transfer interface).
#pragma once

#include <memory>
#include <string>

#include "transfer/transfer_engine.hpp"

namespace kvgrid::cuda {

enum class CopyMode { Memcpy, Kernel, Batch };
// Throws std::invalid_argument naming the accepted values.
CopyMode parse_copy_mode(const std::string& name);
const char* copy_mode_name(CopyMode m);

// Streams are created on the current device (select_device first). cfg.streams streams.
std::unique_ptr<transfer::TransferEngine> make_cuda_engine(const transfer::EngineConfig& cfg, CopyMode mode);

}  // namespace kvgrid::cuda
