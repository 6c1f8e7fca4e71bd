// The ideal prefix hit rate of a request sequence, computed without the cache stack: request i
// reuses the longest page-aligned prefix (at most prompt − 1 tokens) that some earlier request
// left behind — its prompt plus all but the last of its generated tokens, page-aligned — as an
// unbounded cache serving one request at a time would. Page prefixes are compared by exact token
// sequences (std::map keys), not by hashes.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "runtime/serve_workload.hpp"

namespace kvgrid::testing {

struct IdealHit {
  std::uint64_t prompt_tokens = 0, cached_tokens = 0;
  double rate() const { return prompt_tokens ? static_cast<double>(cached_tokens) / static_cast<double>(prompt_tokens) : 0.0; }
};

inline IdealHit ideal_prefix_hit(const std::vector<RequestSpec>& reqs, std::size_t page, std::uint64_t vocab) {
  // Each cached page-aligned prefix is (id of the prefix one page shorter, this page's tokens):
  // exact comparison at a memory cost of one page per cached page.
  std::map<std::pair<std::uint64_t, std::vector<TokenId>>, std::uint64_t> cached;
  auto page_of = [&](const std::vector<TokenId>& t, std::size_t p) {
    return std::vector<TokenId>(t.begin() + static_cast<std::ptrdiff_t>(p * page), t.begin() + static_cast<std::ptrdiff_t>((p + 1) * page));
  };
  IdealHit h;
  for (const auto& r : reqs) {
    const std::size_t limit = (r.prompt.size() - 1) / page;
    std::size_t hit = 0;
    std::uint64_t node = 0;  // the empty prefix
    for (; hit < limit; ++hit) {
      auto it = cached.find({node, page_of(r.prompt, hit)});
      if (it == cached.end()) break;
      node = it->second;
    }
    h.prompt_tokens += r.prompt.size();
    h.cached_tokens += hit * page;
    std::vector<TokenId> kv = r.prompt;
    auto out = model_output(r.prompt, r.output_len, vocab);
    kv.insert(kv.end(), out.begin(), out.end() - 1);
    node = 0;
    for (std::size_t p = 0; (p + 1) * page <= kv.size(); ++p)
      node = cached.emplace(std::make_pair(node, page_of(kv, p)), cached.size() + 1).first->second;
  }
  return h;
}

}  // namespace kvgrid::testing
