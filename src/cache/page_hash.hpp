// Storage (L3) keys: the page hash chain, as SGLang defines it, plus a suffix naming the shard.
//
//   digest_i = SHA-256( digest_{i-1} (32 raw bytes; nothing for the first page)
//                       || page i's token ids as little-endian uint32 )
//
// A chain may start from a prior digest (the last cached page's), so a prefetch beyond a host hit
// continues the chain. The key of a page is its digest in lowercase hex followed by the shard
// suffix of the `rank-suffix` scheme: "_" + model, then "_{tp_rank}_{tp_size}" unless the KV is
// replicated over TP (MLA), "_{pp_size}_{pp_rank}" when PP > 1, "_cp{cp_rank}_{cp_size}" when
// CP > 1 (the `unified` scheme comes with the unified-layout issue).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/ids.hpp"

namespace kvgrid::cache {

using PageDigest = std::array<std::uint8_t, 32>;

// One digest per whole page of `tokens` (a trailing partial page has none).
std::vector<PageDigest> page_hash_chain(std::span<const TokenId> tokens, std::size_t page_size,
                                        const std::optional<PageDigest>& prior = std::nullopt);
std::string to_hex(const PageDigest& d);

struct ShardKey {
  std::string model;
  int tp_rank = 0, tp_size = 1, pp_rank = 0, pp_size = 1, cp_rank = 0, cp_size = 1;
  bool replicated_over_tp = false;  // MLA: one latent for all TP ranks
};
std::string key_suffix(const ShardKey& s);
std::string storage_key(const PageDigest& d, const std::string& suffix);

}  // namespace kvgrid::cache
