// A one-rank cache stack for controller tests: device and host KV pools, the simulated transfer
// engine on a test-driven modelled clock, DeviceCache with the host tier and (optionally) the
// storage tier, an agreement of one rank, and hooks to inject storage faults.
#pragma once

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <string>
#include <unistd.h>
#include <vector>

#include "cache/device_cache.hpp"
#include "cache/page_hash.hpp"
#include "transfer/transfer_engine.hpp"

namespace kvgrid::cache {

namespace fs = std::filesystem;

class Solo final : public AckAgreement {
 public:
  std::string_view name() const override { return "solo"; }
  std::size_t agree(std::size_t ready, std::size_t) override { return ready; }
  bool agree_allocation(bool ok) override { return ok; }
  std::uint64_t agree_min(std::uint64_t v) override { return v; }
};

constexpr std::int64_t kPage = 4;

// Delays every batch that reads or writes one pool's memory (all other copies untouched): a
// backup's or load's event must wait for that part alone.
class DelayPoolEngine final : public transfer::TransferEngine {
 public:
  DelayPoolEngine(std::unique_ptr<transfer::TransferEngine> inner, const KvPool& pool, std::uint64_t delay_ns)
      : inner_(std::move(inner)), delay_(delay_ns) {
    lo_ = reinterpret_cast<const char*>(pool.layer_block(PageId(1), 0));
    hi_ = reinterpret_cast<const char*>(pool.layer_block(PageId(static_cast<std::uint32_t>(pool.config().capacity.value())),
                                                         pool.layers() - 1)) +
          pool.layer_block_bytes();
  }
  std::string_view name() const override { return "delay-pool"; }
  transfer::Event submit(transfer::StreamId s, std::vector<transfer::Copy> batch) override {
    const bool hit = std::any_of(batch.begin(), batch.end(), [this](const transfer::Copy& c) {
      return in(static_cast<const char*>(c.dst)) || in(static_cast<const char*>(c.src));
    });
    if (hit) {
      ++delayed;
      inner_->inject(delay_, false);
    }
    return inner_->submit(s, std::move(batch));
  }
  void inject(std::uint64_t d, bool f) override { inner_->inject(d, f); }
  int delayed = 0;  // batches delayed so far

 private:
  bool in(const char* p) const { return p >= lo_ && p < hi_; }
  std::unique_ptr<transfer::TransferEngine> inner_;
  std::uint64_t delay_;
  const char *lo_ = nullptr, *hi_ = nullptr;
};

struct Rig {
  std::uint64_t clock = 0;
  DecisionLog log;
  Solo agreement;
  KvPool device{{Pages(64), Tokens(kPage), 0, 2, {0, 1}, 1, Payload::Digest}};
  KvPool host{{Pages(64), Tokens(kPage), 0, 2, {0, 1}, 1, Payload::Digest}};
  std::unique_ptr<transfer::TransferEngine> engine;
  DeviceCache dc{{Tokens(kPage), Pages(64)}, log};
  std::string dir;
  std::vector<std::string> failpoints;  // fired in order by page_fault: "name@batch:index"

  Rig(const std::string& tag, const std::string& policy, std::size_t batch_pages = 2, std::string write = "write_through",
      Pages device_pages = Pages(64), bool with_storage = true, std::function<void(HostTierConfig&)> host_cfg = {})
      : dc{{Tokens(kPage), device_pages}, log} {
    transfer::EngineConfig ec;
    ec.jitter = 0;
    ec.bytes_per_ns = 1.0;
    ec.now = [this] { return clock; };
    ec.advance_to = [this](std::uint64_t t) { clock = std::max(clock, t); };
    engine = transfer::make_engine(ec);
    dir = (fs::temp_directory_path() / ("kvgrid-storage-tier-" + tag + "-" + std::to_string(::getpid()))).string();
    fs::remove_all(dir);
    HostTierConfig hc;
    hc.host_pages = Pages(64);
    hc.write_policy = std::move(write);
    hc.load_back_threshold = Tokens(kPage);
    if (host_cfg) host_cfg(hc);
    dc.attach_host_tier(hc, device, host, *engine, agreement);
    if (!with_storage) return;
    StorageTierConfig sc;
    sc.dir = dir;
    sc.key_suffix = "_test";
    sc.prefetch_threshold = Tokens(2 * kPage);
    sc.stop_policy = policy;
    sc.batch_pages = batch_pages;
    sc.jitter = 0;
    sc.latency_ns = 1000;
    sc.bytes_per_ns = 1e9;  // latency only: batch k is seen at (k + 1) × 1000 ns
    sc.timeout_base_ns = 2500;
    sc.timeout_per_1k_ns = 0;
    sc.timeout_max_ns = 1'000'000;
    sc.now = [this] { return clock; };
    sc.faults.page_fault = [this](const char* name, std::size_t) -> std::optional<std::size_t> {
      for (auto& f : failpoints)
        if (f.rfind(std::string(name) + "@" + std::to_string(batch_) + ":", 0) == 0)
          return static_cast<std::size_t>(std::stoul(f.substr(f.find(':') + 1)));
      return std::nullopt;
    };
    sc.faults.read_delay_ns = [this]() -> std::uint64_t { return batch_++ == slow_batch ? slow_ns : 0; };
    dc.attach_storage_tier(sc, host, agreement);
  }
  ~Rig() { fs::remove_all(dir); }

  StorageTier& st() { return *dc.storage_tier(); }
  // Stores pages [0, n) of `prompt` with payload word = 1000 + page index (as a writer would).
  void store(const std::vector<TokenId>& prompt, std::size_t n) {
    auto chain = page_hash_chain(prompt, kPage);
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<std::uint64_t> words(host.layer_block_bytes() / 8 * host.layers(), 1000 + i);
      std::vector<std::uint8_t> bytes(words.size() * 8);
      std::memcpy(bytes.data(), words.data(), bytes.size());
      ASSERT_TRUE(st().storage().set(storage_key(chain[i], "_test"), bytes));
    }
  }
  std::size_t slow_batch = ~std::size_t{0};
  std::uint64_t slow_ns = 0;

 private:
  std::size_t batch_ = 0;
};

inline std::vector<TokenId> prompt(std::size_t n, TokenId base = 1) {
  std::vector<TokenId> p(n);
  std::iota(p.begin(), p.end(), base);
  return p;
}


}  // namespace kvgrid::cache
