// CUDA device helpers. Everything here returns a status instead of aborting when no GPU is
// present, so a CUDA build still runs (and its tests skip) on a machine without one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvgrid::cuda {

// Number of visible CUDA devices; 0 when the driver or a device is missing.
int device_count();
std::string device_name(int device);

// Copies `n_pages` pages of `page_bytes` bytes: dst page dst_ids[i] <- src page src_ids[i], for
// device buffers `dst` and `src` (page id = row index) and device id arrays. One block per page.
// Returns false (with `error` set) when a CUDA call fails.
bool copy_pages(void* dst, const void* src, const std::uint32_t* dst_ids, const std::uint32_t* src_ids,
                std::size_t n_pages, std::size_t page_bytes, std::string* error);

// The NCCL version as "major.minor.patch", or "" when built without NCCL.
std::string nccl_version();

}  // namespace kvgrid::cuda
