#include "cache/page_hash.hpp"

#include <openssl/evp.h>

#include <algorithm>

#include "core/check.hpp"

namespace kvgrid::cache {

std::vector<PageDigest> page_hash_chain(std::span<const TokenId> tokens, std::size_t page_size,
                                        const std::optional<PageDigest>& prior) {
  KVGRID_CHECK(page_size > 0, "page_size 0");
  std::vector<PageDigest> out;
  std::vector<std::uint8_t> page_bytes(page_size * 4);
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  KVGRID_CHECK(ctx != nullptr, "EVP_MD_CTX_new failed");
  std::optional<PageDigest> prev = prior;
  for (std::size_t p = 0; (p + 1) * page_size <= tokens.size(); ++p) {
    for (std::size_t i = 0; i < page_size; ++i) {
      const TokenId t = tokens[p * page_size + i];
      page_bytes[4 * i] = static_cast<std::uint8_t>(t);
      page_bytes[4 * i + 1] = static_cast<std::uint8_t>(t >> 8);
      page_bytes[4 * i + 2] = static_cast<std::uint8_t>(t >> 16);
      page_bytes[4 * i + 3] = static_cast<std::uint8_t>(t >> 24);
    }
    PageDigest d{};
    unsigned int len = 0;
    const bool ok = EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1 &&
                    (!prev || EVP_DigestUpdate(ctx, prev->data(), prev->size()) == 1) &&
                    EVP_DigestUpdate(ctx, page_bytes.data(), page_bytes.size()) == 1 &&
                    EVP_DigestFinal_ex(ctx, d.data(), &len) == 1 && len == d.size();
    if (!ok) {
      EVP_MD_CTX_free(ctx);
      KVGRID_CHECK(false, "SHA-256 failed");
    }
    out.push_back(d);
    prev = d;
  }
  EVP_MD_CTX_free(ctx);
  return out;
}

std::string to_hex(const PageDigest& d) {
  static const char* digits = "0123456789abcdef";
  std::string s(64, '0');
  for (std::size_t i = 0; i < d.size(); ++i) {
    s[2 * i] = digits[d[i] >> 4];
    s[2 * i + 1] = digits[d[i] & 15];
  }
  return s;
}

std::string key_suffix(const ShardKey& s) {
  std::string model = s.model;
  std::replace(model.begin(), model.end(), '/', '-');
  std::string out = "_" + model;
  if (!s.replicated_over_tp) out += "_" + std::to_string(s.tp_rank) + "_" + std::to_string(s.tp_size);
  if (s.pp_size > 1) out += "_" + std::to_string(s.pp_size) + "_" + std::to_string(s.pp_rank);
  if (s.cp_size > 1) out += "_cp" + std::to_string(s.cp_rank) + "_" + std::to_string(s.cp_size);
  return out;
}

std::string storage_key(const PageDigest& d, const std::string& suffix) { return to_hex(d) + suffix; }

}  // namespace kvgrid::cache
