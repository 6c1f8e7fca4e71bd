// Page hash chain against digests computed independently (Python's hashlib, pinned here), and
// the rank-suffix key scheme.
#include <gtest/gtest.h>

#include "cache/page_hash.hpp"

namespace kvgrid::cache {
namespace {

TEST(PageHash, KnownVectorsMatchSha256OverLittleEndianTokenIds) {
  // hashlib.sha256(struct.pack('<4I', 1, 2, 3, 4)) and then over digest_1 + pack('<4I', 5..8)
  std::vector<TokenId> t = {1, 2, 3, 4, 5, 6, 7, 8, 9};  // the 9th token is a partial page: no digest
  auto chain = page_hash_chain(t, 4);
  ASSERT_EQ(chain.size(), 2u);
  EXPECT_EQ(to_hex(chain[0]), "cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72");
  EXPECT_EQ(to_hex(chain[1]), "4ebfa8a1f3c341517621838c6e1b9aa350307e3f00b3cbd1a07ef740f54396d6");
  // Continuing from a prior digest gives the same second page.
  auto tail = page_hash_chain(std::vector<TokenId>{5, 6, 7, 8}, 4, chain[0]);
  ASSERT_EQ(tail.size(), 1u);
  EXPECT_EQ(tail[0], chain[1]);
  // Token ids are full uint32 values.
  EXPECT_EQ(to_hex(page_hash_chain(std::vector<TokenId>{4294967295u, 0}, 2)[0]),
            "72a4fa3544e43a836ffcb268ce06ccdbc55d44d5e6b1b1c19216a53ea98301fd");
}

TEST(PageHash, RankSuffixSchemeNamesTheShard) {
  ShardKey k{"meta/llama-3", 1, 4, 0, 1, 0, 1, false};
  EXPECT_EQ(key_suffix(k), "_meta-llama-3_1_4");
  k.pp_size = 2;
  k.pp_rank = 1;
  k.cp_size = 2;
  k.cp_rank = 1;
  EXPECT_EQ(key_suffix(k), "_meta-llama-3_1_4_2_1_cp1_2");
  k.replicated_over_tp = true;  // MLA: every TP rank reads the same object
  EXPECT_EQ(key_suffix(k), "_meta-llama-3_2_1_cp1_2");
  auto d = page_hash_chain(std::vector<TokenId>{1, 2, 3, 4}, 4)[0];
  EXPECT_EQ(storage_key(d, "_m_0_1"), to_hex(d) + "_m_0_1");
}

}  // namespace
}  // namespace kvgrid::cache
