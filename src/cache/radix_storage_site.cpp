#include "cache/radix_storage_site.hpp"

#include <cstring>

#include "cache/page_hash.hpp"
#include "cache/storage_tier.hpp"
#include "core/check.hpp"

namespace kvgrid::cache {

RadixStorageSite::RadixStorageSite(const StorageContext& ctx, RadixTree& tree, HostTier& host, KvPool& host_kv)
    : ctx_(ctx), tree_(tree), host_(host), host_kv_(host_kv) {
  host_.on_published([this](TreeNode* n) { backup(n); });
}

std::vector<std::uint8_t> RadixStorageSite::page_bytes(PageId page) const {
  const std::size_t block = host_kv_.layer_block_bytes();
  std::vector<std::uint8_t> out(block * host_kv_.layers());
  for (std::size_t l = 0; l < host_kv_.layers(); ++l) std::memcpy(out.data() + l * block, host_kv_.layer_block(page, l), block);
  return out;
}

std::size_t RadixStorageSite::page_object_bytes() const {
  return host_kv_.layer_block_bytes() * host_kv_.layers() + (draft_ ? draft_->object_bytes() : 0);
}

std::vector<std::string> RadixStorageSite::keys_for(std::span<const TokenId> tokens, std::size_t from_page) const {
  const auto digests = page_hash_chain(tokens, static_cast<std::size_t>(tree_.page_size().value()));
  std::vector<std::string> keys;
  for (std::size_t i = from_page; i < digests.size(); ++i) keys.push_back(storage_key(digests[i], ctx_.cfg.key_suffix));
  return keys;
}

void RadixStorageSite::backup(TreeNode* node) {
  if (!ctx_.cfg.writer) return;  // MLA: TP rank 0 writes for everyone
  std::vector<const TreeNode*> path;
  for (const TreeNode* n = node; n != tree_.root(); n = n->parent) path.push_back(n);
  std::vector<TokenId> tokens;
  for (auto it = path.rbegin(); it != path.rend(); ++it) tokens.insert(tokens.end(), (*it)->key.begin(), (*it)->key.end());
  const std::size_t p = static_cast<std::size_t>(tree_.page_size().value());
  const std::size_t first = (tokens.size() - node->key.size()) / p;
  const auto keys = keys_for(tokens, first);
  FileStorage& store = ctx_.store;
  StorageTierStats& stats = ctx_.stats;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (!host_kv_.owns(node->host[i])) continue;  // CP sharding: each page is written by its owner
    if (store.exists(keys[i])) continue;
    if (ctx_.cfg.faults.write_fail && ctx_.cfg.faults.write_fail()) {
      ++stats.write_failed;  // a failed write leaves nothing behind: later prefetches just miss
      continue;
    }
    // A sidecar draft's object first: a page whose target object exists always has its draft.
    if (draft_ && !store.exists(keys[i] + DraftState::kObjectSuffix)) {
      const auto d = draft_->object(node->host[i]);
      if (!store.set(keys[i] + DraftState::kObjectSuffix, d)) {
        ++stats.write_failed;
        continue;
      }
      stats.written_bytes += d.size();
    }
    const auto bytes = page_bytes(node->host[i]);
    if (store.set(keys[i], bytes)) {
      ++stats.written_pages;
      stats.written_bytes += bytes.size();
    } else {
      ++stats.write_failed;
    }
  }
}

std::size_t RadixStorageSite::read(Job& j, std::size_t first, std::size_t count, std::optional<std::size_t> fail_at) {
  auto& job = static_cast<RadixJob&>(j);
  const std::size_t block = host_kv_.layer_block_bytes();
  std::vector<std::uint8_t> buf(block * host_kv_.layers()), dbuf(draft_ ? draft_->object_bytes() : 0);
  for (std::size_t i = 0; i < count; ++i) {
    if (fail_at && i >= *fail_at) return i;  // storage.read.fail: an I/O error from here on
    const PageId page = job.pages[first + i];
    if (!host_kv_.owns(page)) continue;  // CP sharding: its owner reads it
    if (draft_) {  // the draft first: the page counts as read only once both landed
      if (ctx_.store.get(job.keys[first + i] + DraftState::kObjectSuffix, dbuf) != StorageMiss::None) return i;
      draft_->load_object(page, dbuf);
    }
    if (ctx_.store.get(job.keys[first + i], buf) != StorageMiss::None) return i;
    for (std::size_t l = 0; l < host_kv_.layers(); ++l) std::memcpy(host_kv_.layer_block(page, l), buf.data() + l * block, block);
  }
  return count;
}

std::unique_ptr<StorageSite::Job> RadixStorageSite::plan(std::span<const TokenId> prompt) {
  const std::size_t p = static_cast<std::size_t>(tree_.page_size().value());
  const std::size_t threshold = static_cast<std::size_t>(ctx_.cfg.prefetch_threshold.value());
  const std::size_t max_pages = prompt.empty() ? 0 : (prompt.size() - 1) / p;  // reuse at most prompt - 1
  if (max_pages * p < threshold) return nullptr;
  MatchResult m = tree_.peek_prefix(prompt);
  const std::size_t cached = static_cast<std::size_t>(m.host_matched.value()) / p;
  if ((max_pages - cached) * p < threshold) return nullptr;
  auto pl = std::make_unique<RadixJob>();
  pl->anchor = m.host_path.empty() ? m.last_node : m.host_path.back();
  while (pl->anchor != tree_.root() && pl->anchor->host.empty()) pl->anchor = pl->anchor->parent;
  for (const TreeNode* n = pl->anchor; n != tree_.root(); n = n->parent) pl->start += n->key.size() / p;
  pl->cached = cached;
  pl->tokens.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(max_pages * p));
  pl->keys = keys_for(pl->tokens, pl->start);
  FileStorage& store = ctx_.store;
  if (!ctx_.cfg.writer) {
    pl->local_hit = pl->keys.size();  // MLA readers: the writer decides
  } else if (!host_kv_.sharded()) {
    pl->local_hit = store.batch_exists(pl->keys);
    if (draft_) {  // the MIN of the target's and the draft's leading hits
      std::vector<std::string> dkeys;
      for (const auto& k : pl->keys) dkeys.push_back(k + DraftState::kObjectSuffix);
      pl->local_hit = std::min(pl->local_hit, store.batch_exists(dkeys));
    }
  } else {
    // CP sharding: this rank looks up only the pages it owns (the others count as present here;
    // their owners look them up), so the MIN over the shard group is the leading hit of them all.
    std::vector<std::string> mine;
    std::vector<std::size_t> at;
    const CpPlacement& plc = host_kv_.placement();
    for (std::size_t i = 0; i < pl->keys.size(); ++i)
      if ((pl->start + i) % plc.shards == host_kv_.shard_rank()) {
        mine.push_back(pl->keys[i]);
        at.push_back(i);
      }
    const std::size_t k = store.batch_exists(mine);
    pl->local_hit = k < mine.size() ? at[k] : pl->keys.size();
  }
  return pl;
}

void RadixStorageSite::pin(Job& j) { tree_.lock(static_cast<RadixJob&>(j).anchor); }
void RadixStorageSite::unpin(Job& j) { tree_.unlock(static_cast<RadixJob&>(j).anchor); }

bool RadixStorageSite::allocate(Job& j, std::size_t hit, CrossStageAgreement* cross) {
  auto& job = static_cast<RadixJob&>(j);
  // CP sharding: the page at position P belongs to rank P mod N (its host copy too).
  const auto first_owner = static_cast<std::uint32_t>(job.start % host_kv_.placement().shards);
  std::optional<std::vector<PageId>> pages;
  if (cross) {  // across stages: every rank serving the request must have allocated
    bool faulted = false;
    pages = host_.alloc_host_local(Pages(static_cast<std::int64_t>(hit)), &faulted, first_owner);
    std::vector<std::uint64_t> ok{pages && !faulted ? 1u : 0u};
    cross->min(ok);
    if (!ok[0] && pages) {
      host_.free_host(*pages);
      pages.reset();
    }
  } else {
    pages = host_.alloc_host(Pages(static_cast<std::int64_t>(hit)), first_owner);
  }
  if (!pages) return false;
  job.pages = std::move(*pages);
  return true;
}

std::size_t RadixStorageSite::land(Job& j, std::size_t keep) {
  auto& job = static_cast<RadixJob&>(j);
  const std::size_t p = static_cast<std::size_t>(tree_.page_size().value());
  std::vector<PageId> unused;
  std::size_t used = 0;
  if (keep > 0) {
    const std::size_t end = (job.start + keep) * p;
    unused = tree_.insert_host(std::span<const TokenId>(job.tokens).first(end), Tokens(static_cast<std::int64_t>(job.start * p)),
                               std::span<const PageId>(job.pages).first(keep));
    used = keep - unused.size();
  }
  unused.insert(unused.end(), job.pages.begin() + static_cast<std::ptrdiff_t>(keep), job.pages.end());
  host_.free_host(unused);
  tree_.unlock(job.anchor);
  return used;
}

}  // namespace kvgrid::cache
