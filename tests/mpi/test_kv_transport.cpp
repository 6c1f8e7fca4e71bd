// The KV transport between paired ranks (P/D suffix transfer): the first half of the world sends
// layers of scattered pages to its peer in the second half, which receives them into other
// pages; both payloads, layers posted in opposite orders on the two sides, two requests' messages
// on the same tags arriving in order. The received pages fold exactly like the sent ones. Both the
// MPI transport and the ordered transport (engine.collectives = nccl's, over an MPI data plane that
// pairs by posting order alone, as NCCL does) — which must hold the early layers' messages for the
// receives posted later (each path forced in a test of its own), and keep a cancelled receive from
// swallowing a later message; with several peers (4+ ranks) each peer's messages stay its own.
#include <gtest/gtest.h>

#include <vector>

#include "cache/kv_pool.hpp"
#include "mpi_util.hpp"
#include "transfer/kv_transport.hpp"
#include "transfer/ordered_transport.hpp"

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

std::unique_ptr<transfer::KvTransport> make(bool ordered) {
  return ordered ? transfer::make_ordered_transport(MPI_COMM_WORLD, transfer::make_mpi_ordered_plane(MPI_COMM_WORLD))
                 : transfer::make_mpi_transport(MPI_COMM_WORLD);
}

TEST(KvTransport, LayersOfScatteredPagesArriveIntactAndInOrder) {
  const int n = testing::world_size(), me = testing::world_rank();
  if (n < 2 || n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  const bool sender = me < n / 2;
  const int peer = sender ? me + n / 2 : me - n / 2;
  for (const bool ordered : {false, true})
  for (const auto payload : {cache::Payload::Full, cache::Payload::Digest}) {
    auto transport = make(ordered);
    SCOPED_TRACE(::testing::Message() << transport->name() << (payload == cache::Payload::Full ? " full" : " digest"));
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

// A cancelled receive matches nothing: the message of its tag that arrives afterwards goes to the
// next receive of that tag (as a cancelled MPI receive leaves it), and messages of other tags are
// untouched. The sender posts only after the receiver cancelled (a barrier between).
TEST(KvTransport, OrderedTransportCancelLeavesTheMessageToTheNextReceive) {
  const int n = testing::world_size(), me = testing::world_rank();
  if (n < 2 || n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  const bool sender = me < n / 2;
  const int peer = sender ? me + n / 2 : me - n / 2;
  auto transport = make(true);
  std::vector<std::uint64_t> a(64), b(64), c(32);
  const auto blk = [](std::vector<std::uint64_t>& v) { return std::vector<transfer::Block>{{v.data(), v.size() * 8}}; };
  if (sender) {
    for (std::size_t i = 0; i < 64; ++i) a[i] = 1000 + i, b[i] = 2000 + i;
    for (std::size_t i = 0; i < 32; ++i) c[i] = 3000 + i;
    MPI_Barrier(MPI_COMM_WORLD);  // the receiver has cancelled its first receive of tag 7
    auto e1 = transport->send(peer, 7, blk(a));
    auto e2 = transport->send(peer, 9, blk(c));
    auto e3 = transport->send(peer, 7, blk(b));
    e1.synchronize(), e2.synchronize(), e3.synchronize();
  } else {
    std::vector<std::uint64_t> gone(64, 0);
    auto cancelled = transport->recv(peer, 7, blk(gone));
    cancelled.cancel();
    EXPECT_TRUE(cancelled.query());
    MPI_Barrier(MPI_COMM_WORLD);
    auto r9 = transport->recv(peer, 9, blk(c));  // posted first, matched second: tags, not order
    auto r7a = transport->recv(peer, 7, blk(a));
    auto r7b = transport->recv(peer, 7, blk(b));
    r7b.synchronize(), r9.synchronize(), r7a.synchronize();
    for (std::size_t i = 0; i < 64; ++i) {
      EXPECT_EQ(a[i], 1000 + i);
      EXPECT_EQ(b[i], 2000 + i);
      EXPECT_EQ(gone[i], 0u);
    }
    for (std::size_t i = 0; i < 32; ++i) EXPECT_EQ(c[i], 3000 + i);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Each matching path forced: every receive posted before any announcement arrives (queued receives
// matched by tag), and every message announced before any receive is posted (held messages: the
// marker's receive completing proves the earlier announcements were taken, in order). In both,
// receives posted in the opposite order get their own tag's bytes.
TEST(KvTransport, OrderedTransportMatchesByTagWhetherTheReceiveOrTheMessageComesFirst) {
  const int n = testing::world_size(), me = testing::world_rank();
  if (n < 2 || n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  const bool sender = me < n / 2;
  const int peer = sender ? me + n / 2 : me - n / 2;
  const auto blk = [](std::vector<std::uint64_t>& v) { return std::vector<transfer::Block>{{v.data(), v.size() * 8}}; };
  constexpr int kMessages = 6;
  for (const bool held : {false, true}) {
    SCOPED_TRACE(held ? "messages first (held)" : "receives first (queued)");
    auto transport = make(true);
    std::vector<std::vector<std::uint64_t>> buf(kMessages, std::vector<std::uint64_t>(16, 0));
    std::vector<std::uint64_t> marker(1, 0);
    std::vector<transfer::Event> events;
    if (sender) {
      for (int m = 0; m < kMessages; ++m)
        for (std::size_t i = 0; i < 16; ++i) buf[m][i] = 100 * static_cast<std::uint64_t>(m) + i + 1;
      marker[0] = 77;
      if (!held) MPI_Barrier(MPI_COMM_WORLD);  // every receive is posted
      for (int m = 0; m < kMessages; ++m) events.push_back(transport->send(peer, 10 + m, blk(buf[m])));
      events.push_back(transport->send(peer, 99, blk(marker)));
    } else {
      if (held) {
        transport->recv(peer, 99, blk(marker)).synchronize();  // the six before it are held now
        EXPECT_EQ(marker[0], 77u);
      }
      for (int m = kMessages; m-- > 0;) events.push_back(transport->recv(peer, 10 + m, blk(buf[m])));
      if (!held) {
        MPI_Barrier(MPI_COMM_WORLD);
        events.push_back(transport->recv(peer, 99, blk(marker)));
      }
    }
    for (auto& e : events) e.synchronize();
    if (!sender) {
      EXPECT_EQ(marker[0], 77u);
      for (int m = 0; m < kMessages; ++m)
        for (std::size_t i = 0; i < 16; ++i) EXPECT_EQ(buf[m][i], 100 * static_cast<std::uint64_t>(m) + i + 1) << "tag " << 10 + m;
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

// Many to many: every rank of the first half sends to every rank of the second half, the same tags
// to each peer, each sender in its own order; each receiver posts its receives interleaving the
// peers in another order. Bytes are matched per (peer, tag), never across peers.
TEST(KvTransport, OrderedTransportKeepsPeersApart) {
  const int n = testing::world_size(), me = testing::world_rank();
  if (n < 4 || n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks, at least 4";
  const int half = n / 2;
  const bool sender = me < half;
  const auto blk = [](std::vector<std::uint64_t>& v) { return std::vector<transfer::Block>{{v.data(), v.size() * 8}}; };
  const auto value = [](int from, int to, int tag, std::size_t i) {
    return static_cast<std::uint64_t>(from) * 1000000 + static_cast<std::uint64_t>(to) * 10000 + static_cast<std::uint64_t>(tag) * 100 + i;
  };
  constexpr int kTags = 4;
  auto transport = make(true);
  std::vector<std::vector<std::uint64_t>> buf(static_cast<std::size_t>(half * kTags), std::vector<std::uint64_t>(8, 0));
  std::vector<transfer::Event> events;
  for (int k = 0; k < half * kTags; ++k) {
    // Senders walk (tag, peer) — peers interleaved — from their own offset; receivers walk
    // (peer, tag) backwards, peers outermost.
    const int j = sender ? (k + me) % (half * kTags) : half * kTags - 1 - k;
    const int peer = (sender ? j % half : j / kTags) + (sender ? half : 0);
    const int tag = sender ? j / half : j % kTags;
    auto& b = buf[static_cast<std::size_t>((peer % half) * kTags + tag)];
    if (sender) {
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = value(me, peer, tag, i);
      events.push_back(transport->send(peer, 20 + tag, blk(b)));
    } else {
      events.push_back(transport->recv(peer, 20 + tag, blk(b)));
    }
  }
  for (auto& e : events) e.synchronize();
  if (!sender) {
    for (int from = 0; from < half; ++from)
      for (int tag = 0; tag < kTags; ++tag)
        for (std::size_t i = 0; i < 8; ++i) {
          EXPECT_EQ(buf[static_cast<std::size_t>(from * kTags + tag)][i], value(from, me, tag, i)) << "from " << from << " tag " << tag;
        }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace kvgrid
