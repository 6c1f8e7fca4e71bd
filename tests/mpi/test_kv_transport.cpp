// The KV transport between paired ranks (P/D suffix transfer): the first half of the world sends
// layers of scattered pages to its peer in the second half, which receives them into other
// pages; both payloads, layers posted in opposite orders on the two sides, two requests' messages
// on the same tags arriving in order. The received pages fold exactly like the sent ones.
#include <gtest/gtest.h>

#include <vector>

#include "cache/kv_pool.hpp"
#include "mpi_util.hpp"
#include "transfer/kv_transport.hpp"

namespace kvgrid {
namespace {

cache::KvPool pool(cache::Payload payload) {
  return cache::KvPool({Pages(16), Tokens(4), 0, 3, {0, 1}, 5, payload});
}

std::vector<std::uint64_t> folds(const cache::KvPool& pool, std::span<const PageId> pages) { return pool.page_folds(pages); }

// Writes 4 tokens into each page, features depending on (request, page index).
void fill(cache::KvPool& p, const std::vector<PageId>& pages, std::uint64_t request) {
  std::vector<std::uint32_t> pg, slot;
  std::vector<std::uint64_t> F;
  for (std::size_t i = 0; i < pages.size(); ++i)
    for (std::uint32_t s = 0; s < 4; ++s) {
      pg.push_back(pages[i].value());
      slot.push_back(s);
      F.push_back(request * 1000 + i * 10 + s + 1);
    }
  p.reset(pages);
  p.write(pg, slot, F);
}

TEST(KvTransport, LayersOfScatteredPagesArriveIntactAndInOrder) {
  const int n = testing::world_size(), me = testing::world_rank();
  if (n < 2 || n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  const bool sender = me < n / 2;
  const int peer = sender ? me + n / 2 : me - n / 2;
  auto transport = transfer::make_mpi_transport(MPI_COMM_WORLD);
  for (const auto payload : {cache::Payload::Full, cache::Payload::Digest}) {
    SCOPED_TRACE(payload == cache::Payload::Full ? "full" : "digest");
    cache::KvPool p = pool(payload), expected = pool(payload);
    const std::vector<PageId> src{PageId(3), PageId(7), PageId(5)}, dst{PageId(2), PageId(4), PageId(6)};
    const std::vector<PageId> src2{PageId(9), PageId(11)}, dst2{PageId(10), PageId(12)};
    std::vector<transfer::Event> events;
    if (sender) {
      fill(p, src, 1);
      fill(p, src2, 2);
      for (std::size_t l = 0; l < p.layers(); ++l) {  // request 1 then request 2, layer tags 100 + l
        events.push_back(transport->send(peer, 100 + static_cast<int>(l), cache::layer_blocks(p, src, l)));
        events.push_back(transport->send(peer, 100 + static_cast<int>(l), cache::layer_blocks(p, src2, l)));
      }
    } else {
      p.reset(dst);
      p.reset(dst2);
      for (std::size_t l = p.layers(); l-- > 0;) {  // the other layer order: tags keep them apart
        events.push_back(transport->recv(peer, 100 + static_cast<int>(l), cache::layer_blocks(p, dst, l)));
        events.push_back(transport->recv(peer, 100 + static_cast<int>(l), cache::layer_blocks(p, dst2, l)));
      }
      EXPECT_EQ(events.front().bytes(), 3 * p.layer_block_bytes());
    }
    for (auto& e : events) e.synchronize();
    if (!sender) {
      fill(expected, src, 1);
      fill(expected, src2, 2);
      EXPECT_EQ(folds(p, dst), folds(expected, src));
      EXPECT_EQ(folds(p, dst2), folds(expected, src2));
      EXPECT_NE(folds(p, dst), folds(expected, src2));
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

}  // namespace
}  // namespace kvgrid
