// Transfer engines: FIFO streams, per-layer events, copies invisible before completion
// (simulated), seeded determinism, injected delay and failure; the same behaviours on real threads.
#include <gtest/gtest.h>

#include <numeric>

#include "core/check.hpp"
#include "core/wait.hpp"
#include "transfer/polled_event.hpp"
#include "transfer/transfer_engine.hpp"

namespace kvgrid::transfer {
namespace {

struct Clock {
  std::uint64_t t = 0;
  EngineConfig cfg(const std::string& backend, std::uint64_t seed = 1) {
    EngineConfig c;
    c.backend = backend;
    c.seed = seed;
    c.bytes_per_ns = 1.0;  // 1 byte per ns: times are easy to read
    c.jitter = 0.5;
    c.now = [this] { return t; };
    c.advance_to = [this](std::uint64_t v) { t = v; };
    return c;
  }
};

std::vector<std::uint8_t> bytes(std::size_t n, std::uint8_t base) {
  std::vector<std::uint8_t> v(n);
  std::iota(v.begin(), v.end(), base);
  return v;
}

TEST(SimulatedEngine, CopiesLandOnlyWhenTheEventIsObservedComplete) {
  Clock clk;
  auto e = make_engine(clk.cfg("simulated"));
  auto src = bytes(1000, 1);
  std::vector<std::uint8_t> dst(1000, 0);
  Event ev = e->submit(0, {{dst.data(), src.data(), 1000}});
  EXPECT_GE(ev.complete_ns(), 1000u);  // 1000 bytes at 1 byte/ns, jitter >= 1
  EXPECT_LE(ev.complete_ns(), 1501u);
  EXPECT_FALSE(ev.query());
  EXPECT_EQ(dst, std::vector<std::uint8_t>(1000, 0));  // a reader that jumps ahead sees stale data
  clk.t = ev.complete_ns() - 1;
  EXPECT_FALSE(ev.query());
  clk.t = ev.complete_ns();
  EXPECT_TRUE(ev.query());
  EXPECT_EQ(dst, src);
}

TEST(SimulatedEngine, StreamsAreFifoAndLayersCompleteInOrder) {
  Clock clk;
  auto e = make_engine(clk.cfg("simulated"));
  std::vector<std::uint8_t> a(4000), b(10), src(4000, 7);
  Event big = e->submit(1, {{a.data(), src.data(), 4000}});
  Event small = e->submit(1, {{b.data(), src.data(), 10}});
  EXPECT_GT(small.complete_ns(), big.complete_ns());  // the small copy waits behind the big one
  Event other = e->submit(2, {{b.data(), src.data(), 10}});
  EXPECT_LT(other.complete_ns(), big.complete_ns());  // another stream does not
  std::vector<std::vector<std::uint8_t>> layers(4, std::vector<std::uint8_t>(100));
  std::vector<std::vector<Copy>> per_layer;
  for (auto& l : layers) per_layer.push_back({{l.data(), src.data(), 100}});
  auto evs = e->submit_layers(3, per_layer);
  ASSERT_EQ(evs.size(), 4u);
  for (std::size_t i = 1; i < evs.size(); ++i) EXPECT_GT(evs[i].complete_ns(), evs[i - 1].complete_ns());
  clk.t = evs[1].complete_ns();
  EXPECT_TRUE(evs[0].query() && evs[1].query());
  EXPECT_FALSE(evs[2].query());
  evs[3].synchronize();  // advances the modelled clock
  EXPECT_EQ(clk.t, evs[3].complete_ns());
  EXPECT_TRUE(evs[2].query());
  EXPECT_EQ(layers[3], std::vector<std::uint8_t>(100, 7));
}

TEST(SimulatedEngine, CompletionTimesComeFromTheSeed) {
  auto times = [](std::uint64_t seed) {
    Clock clk;
    auto e = make_engine(clk.cfg("simulated", seed));
    std::vector<std::uint8_t> d(100), s(100);
    std::vector<std::uint64_t> t;
    for (int i = 0; i < 8; ++i) t.push_back(e->submit(i % 4, {{d.data(), s.data(), 100}}).complete_ns());
    return t;
  };
  EXPECT_EQ(times(5), times(5));
  EXPECT_NE(times(5), times(6));
}

TEST(SimulatedEngine, InjectedDelayAndFailure) {
  Clock clk;
  auto cfg = clk.cfg("simulated");
  cfg.jitter = 0;
  auto e = make_engine(cfg);
  std::vector<std::uint8_t> d(100, 0), s(100, 9);
  EXPECT_EQ(e->submit(0, {{d.data(), s.data(), 100}}).complete_ns(), 101u);
  e->inject(5000, false);
  EXPECT_EQ(e->submit(1, {{d.data(), s.data(), 100}}).complete_ns(), 5101u);
  EXPECT_EQ(e->submit(2, {{d.data(), s.data(), 100}}).complete_ns(), 101u);  // only the next batch
  std::vector<std::uint8_t> f(100, 0);
  e->inject(0, true);
  Event bad = e->submit(3, {{f.data(), s.data(), 100}});
  bad.synchronize();
  EXPECT_TRUE(bad.failed());
  EXPECT_EQ(f, std::vector<std::uint8_t>(100, 0));  // a failed transfer never becomes data
}

TEST(ThreadedEngine, RealCopiesFifoPerStreamAndFailure) {
  EngineConfig cfg;
  cfg.backend = "threaded";
  auto e = make_engine(cfg);
  const std::size_t n = 1 << 20;
  auto src = bytes(n, 3);
  std::vector<std::vector<std::uint8_t>> dst(6, std::vector<std::uint8_t>(n, 0));
  std::vector<Event> evs;
  for (auto& d : dst) evs.push_back(e->submit(0, {{d.data(), src.data(), n / 2}, {d.data() + n / 2, src.data() + n / 2, n / 2}}));
  evs.back().synchronize();
  for (std::size_t i = 0; i < evs.size(); ++i) {
    EXPECT_TRUE(evs[i].query()) << "FIFO: batch " << i << " done before the last one";
    EXPECT_EQ(dst[i], src);
  }
  std::vector<std::uint8_t> f(100, 0);
  e->inject(1000, true);
  Event bad = e->submit(1, {{f.data(), src.data(), 100}});
  bad.synchronize();
  EXPECT_TRUE(bad.failed());
  EXPECT_EQ(f, std::vector<std::uint8_t>(100, 0));
}

TEST(TransferEngine, UnknownBackendIsAnInputError) {
  EngineConfig cfg;
  cfg.backend = "rdma";
  EXPECT_THROW(make_engine(cfg), InputError);
}

}  // namespace
}  // namespace kvgrid::transfer

// ---- KV pages through an engine: device → host → device keeps every fold, in both payloads ----

#include "cache/kv_pool.hpp"
#include "kokkos_env.hpp"

namespace kvgrid::transfer {
namespace {

[[maybe_unused]] const bool kokkos_ready = (kvgrid::testing::ensure_kokkos(), true);

TEST(KvPoolTransfer, BackupAndLayerWiseLoadPreserveFoldsOnBothEngines) {
  for (const char* backend : {"simulated", "threaded"}) {
    for (auto payload : {cache::Payload::Full, cache::Payload::Digest}) {
      SCOPED_TRACE(std::string(backend) + (payload == cache::Payload::Full ? " full" : " digest"));
      cache::KvPoolConfig cfg{Pages(8), Tokens(4), 2, 3, {0, 5}, 4, payload};
      cache::KvPool device(cfg), host(cfg), device2(cfg);
      std::vector<std::uint32_t> page, slot;
      std::vector<std::uint64_t> F;
      for (std::uint32_t p : {2u, 6u})
        for (std::uint32_t s = 0; s < 4; ++s) {
          page.push_back(p);
          slot.push_back(s);
          F.push_back(0x1234567ULL * (p * 4 + s + 1));
        }
      device.write(page, slot, F);
      std::vector<std::uint64_t> want(6, 0), got(6, 0);
      device.fold_pages(std::vector<std::uint32_t>{2, 6}, want);

      Clock clk;
      auto e = make_engine(clk.cfg(backend));
      std::vector<PageId> dev = {PageId(2), PageId(6)}, hst = {PageId(7), PageId(1)}, dev2 = {PageId(3), PageId(4)};
      // Backup: one batch with every layer.
      std::vector<Copy> flat;
      for (auto& l : cache::layer_copies(host, hst, device, dev)) flat.insert(flat.end(), l.begin(), l.end());
      e->submit(0, flat).synchronize();
      // Load back layer by layer into other device pages.
      auto evs = e->submit_layers(1, cache::layer_copies(device2, dev2, host, hst));
      ASSERT_EQ(evs.size(), 3u);
      for (auto& ev : evs) ev.synchronize();
      device2.fold_pages(std::vector<std::uint32_t>{3, 4}, got);
      EXPECT_EQ(got, want);
    }
  }
}

TEST(KvPoolTransfer, IncompatiblePoolsAreRefused) {
  cache::KvPool a({Pages(4), Tokens(4), 0, 2, {0}, 2, cache::Payload::Full});
  cache::KvPool b({Pages(4), Tokens(4), 0, 2, {0}, 2, cache::Payload::Digest});
  std::vector<PageId> p = {PageId(1)};
  EXPECT_THROW(cache::layer_copies(a, p, b, p), InternalError);
}

// The GPU backends' events reach the stack through transfer::polled (the cuda engine, the NCCL
// gather and P/D plane): their wait polls through core/wait — never the event's own blocking
// synchronize —, bytes and a failure known only at completion carry over, and one that never
// completes ends in the watchdog naming it.
TEST(PolledEvent, WaitsThroughCoreWaitAndKeepsTheEventsState) {
  struct Countdown final : transfer::EventState {
    int left = 0;
    bool query() override {
      if (left > 0 && --left == 0) failed = true;  // (the failure is learnt at completion)
      return left == 0;
    }
    void synchronize() override { ADD_FAILURE() << "the blocking synchronize was called"; }
  };
  auto c = std::make_shared<Countdown>();
  c->left = 5;
  c->bytes = 42;
  const transfer::Event e = transfer::polled(transfer::Event(c), "a countdown");
  EXPECT_EQ(e.bytes(), 42u);
  EXPECT_FALSE(e.failed());
  EXPECT_FALSE(e.query());
  e.synchronize();
  EXPECT_TRUE(e.query());
  EXPECT_TRUE(e.failed());
  EXPECT_EQ(c->left, 0);
  // ... and through a joined event (a P/D send: announcement and data; a target and a draft copy).
  auto d = std::make_shared<Countdown>();
  d->left = 3;
  const transfer::Event joined = transfer::join({transfer::Event(), transfer::polled(transfer::Event(d), "a draft copy")});
  EXPECT_FALSE(joined.failed());
  joined.synchronize();
  EXPECT_TRUE(joined.failed());

  auto never = std::make_shared<Countdown>();
  never->left = 1 << 30;
  const transfer::Event n = transfer::polled(transfer::Event(never), "a copy that never lands");
  const auto deadline = wait_deadline();
  set_wait_deadline(std::chrono::duration<double>(0.05));
  try {
    n.synchronize();
    ADD_FAILURE() << "no watchdog";
  } catch (const WatchdogTimeout& w) {
    EXPECT_NE(std::string(w.what()).find("a copy that never lands"), std::string::npos) << w.what();
  }
  set_wait_deadline(deadline);
}

}  // namespace
}  // namespace kvgrid::transfer
