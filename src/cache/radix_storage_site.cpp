#include "cache/radix_storage_site.hpp"

#include <cstring>
#include <deque>

#include "cache/page_hash.hpp"
#include "cache/storage_tier.hpp"
#include "core/check.hpp"

namespace kvgrid::cache {

RadixStorageSite::RadixStorageSite(const StorageContext& ctx, RadixTree& tree, HostTier& host, KvPool& host_kv)
    : ctx_(ctx), tree_(tree), host_(host), host_kv_(host_kv) {
  host_.on_published([this](TreeNode* n) { backup(n); });
  if (!ctx_.cfg.unified.empty()) parts_.push_back(make_part(host_kv_, ctx_.cfg.unified, 0));
}

RadixStorageSite::UnifiedPart RadixStorageSite::make_part(KvPool& pool, const std::vector<UnifiedChunk>& chunks,
                                                          std::size_t layer0) const {
  UnifiedPart p{&pool, chunks, {}, {0}};
  for (const auto& c : chunks) {
    kernels::ChunkSpan s = c.local;
    s.layer0 += layer0;
    p.spans.push_back(s);
    p.offsets.push_back(p.offsets.back() + pool.object_words(s));
  }
  return p;
}

void RadixStorageSite::set_draft(DraftState* d) {
  if (!unified()) {
    draft_ = d && d->separate_objects() ? d : nullptr;
    return;
  }
  // Unified keys: packed and sidecar drafts alike are objects of the draft's namespace, from
  // wherever the draft's host rows are (target_only: nothing of the draft is stored).
  KVGRID_CHECK(parts_.size() == 1, "set_draft twice");
  if (!d || !d->host()) return;
  KVGRID_CHECK(!ctx_.cfg.unified_draft.empty(), "a draft model without its unified objects");
  parts_.insert(parts_.begin(), make_part(*d->host(), ctx_.cfg.unified_draft, d->host_layer0()));
}

std::vector<std::uint8_t> RadixStorageSite::page_bytes(PageId page) const {
  const std::size_t block = host_kv_.layer_block_bytes();
  std::vector<std::uint8_t> out(block * host_kv_.layers());
  for (std::size_t l = 0; l < host_kv_.layers(); ++l) std::memcpy(out.data() + l * block, host_kv_.layer_block(page, l), block);
  return out;
}

std::size_t RadixStorageSite::page_object_bytes() const {
  if (unified()) {
    std::size_t words = 0;
    for (const auto& part : parts_) words += part.offsets.back();
    return words * sizeof(std::uint64_t);
  }
  return host_kv_.layer_block_bytes() * host_kv_.layers() + (draft_ ? draft_->object_bytes() : 0);
}

std::vector<PageDigest> RadixStorageSite::digests_for(std::span<const TokenId> tokens, std::size_t from_page) const {
  auto digests = page_hash_chain(tokens, static_cast<std::size_t>(tree_.page_size().value()));
  digests.erase(digests.begin(), digests.begin() + static_cast<std::ptrdiff_t>(std::min(from_page, digests.size())));
  return digests;
}

std::vector<std::string> RadixStorageSite::keys_for(std::span<const PageDigest> digests) const {
  std::vector<std::string> keys;
  for (const auto& d : digests)
    keys.push_back(unified() ? unified_key(d, ctx_.cfg.unified.front()) : storage_key(d, ctx_.cfg.key_suffix));
  return keys;
}

bool RadixStorageSite::unified() const { return !ctx_.cfg.unified.empty(); }

std::size_t RadixStorageSite::objects_per_item() const {
  if (!unified()) return draft_ ? 2 : 1;
  std::size_t n = 0;
  for (const auto& part : parts_) n += part.chunks.size();
  return n;
}

std::vector<std::string> RadixStorageSite::chunk_keys(const PageDigest& d) const {
  std::vector<std::string> keys;
  for (const auto& part : parts_)
    for (const auto& c : part.chunks) keys.push_back(unified_key(d, c));
  return keys;
}

std::vector<std::string> RadixStorageSite::objects(const Job& j, std::size_t item) const {
  if (!unified()) return StorageSite::objects(j, item);
  return chunk_keys(static_cast<const RadixJob&>(j).digests[item]);  // (the draft's first)
}

// Write-through of a published host backup. The node's pages this rank writes (CP sharding: their
// owner) and each page's objects — unified: the draft's chunks, then the target's; rank_suffix: a
// sidecar draft's object, then the page's — are looked up at once (one round trip on Redis); the
// missing objects of pages not hit by storage.write.fail go to the writer as one batch, in order (a
// page's draft first; storage_writer.hpp says when they land). Objects already there (written
// earlier, in flight, or by another job) are immutable and left alone.
void RadixStorageSite::backup(TreeNode* node) {
  if (!ctx_.cfg.writer) return;  // MLA (unified: CP replicas too): the first rank writes for everyone
  std::vector<const TreeNode*> path;
  for (const TreeNode* n = node; n != tree_.root(); n = n->parent) path.push_back(n);
  std::vector<TokenId> tokens;
  for (auto it = path.rbegin(); it != path.rend(); ++it) tokens.insert(tokens.end(), (*it)->key.begin(), (*it)->key.end());
  const std::size_t p = static_cast<std::size_t>(tree_.page_size().value());
  const std::size_t first = (tokens.size() - node->key.size()) / p;
  const auto digests = digests_for(tokens, first);
  const auto primary = keys_for(digests);
  struct Page {
    std::size_t item, first, count;  // its objects: keys[first, first + count)
  };
  std::vector<Page> pages;
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < digests.size(); ++i) {
    if (!host_kv_.owns(node->host[i])) continue;
    Page pg{i, keys.size(), 0};
    if (unified()) {
      const auto k = chunk_keys(digests[i]);
      keys.insert(keys.end(), k.begin(), k.end());
    } else {
      if (draft_) keys.push_back(primary[i] + DraftState::kObjectSuffix);
      keys.push_back(primary[i]);
    }
    pg.count = keys.size() - pg.first;
    pages.push_back(pg);
  }
  const std::vector<bool> there = ctx_.writer.present(keys);  // in flight counts as there
  WriteBatch batch;
  for (const Page& pg : pages) {
    bool missing = false;
    for (std::size_t o = 0; o < pg.count; ++o) missing = missing || !there[pg.first + o];
    if (!missing) continue;
    if (ctx_.cfg.faults.write_fail && ctx_.cfg.faults.write_fail()) {
      ++ctx_.stats.write_failed;  // a failed write leaves nothing behind: later prefetches just miss
      continue;
    }
    const PageId page = node->host[pg.item];
    const std::size_t g = batch.open_group(true);
    auto add = [&](std::size_t o, std::span<const std::uint8_t> bytes) {
      if (!there[pg.first + o]) batch.add(g, keys[pg.first + o], bytes);
    };
    std::size_t o = 0;
    if (unified()) {
      for (const auto& part : parts_) {
        auto& w = batch.words.emplace_back(part.offsets.back());
        part.pool->pack(std::span<const PageId>(&page, 1), part.spans, w.data());
        for (std::size_t c = 0; c < part.chunks.size(); ++c, ++o)
          add(o, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(w.data() + part.offsets[c]),
                                               (part.offsets[c + 1] - part.offsets[c]) * sizeof(std::uint64_t)));
      }
    } else {
      if (draft_) add(o++, batch.bytes.emplace_back(draft_->object(page)));
      add(o, batch.bytes.emplace_back(page_bytes(page)));
    }
  }
  ctx_.writer.submit(std::move(batch));  // written in order (a page's draft first), off the loop
}

// The batch's objects are fetched as one batch (one round trip on Redis): every object of the
// items this rank reads, in order (a page's draft objects first, so a page counts as read only
// once both landed); then the leading items whose objects all arrived intact land in their host
// pages.
std::size_t RadixStorageSite::read(Job& j, std::size_t first, std::size_t count, std::optional<std::size_t> fail_at) {
  auto& job = static_cast<RadixJob&>(j);
  const std::size_t n = fail_at ? std::min(count, *fail_at) : count;  // storage.read.fail: an I/O error from there on
  std::vector<std::string> keys;
  std::vector<std::size_t> words, item_end(n);  // each object's size; objects up to the end of item i
  // A part whose pool is page_unified (cache.host_layout) has each object read straight into its
  // page's row, at the chunk's offset; the others' objects go to a buffer and are unpacked.
  std::vector<std::uint64_t*> dest;  // per object: where it lands in place (nullptr: the buffer)
  for (std::size_t i = 0; i < n; ++i) {
    if (host_kv_.owns(job.pages[first + i])) {  // CP sharding: its owner reads it
      if (unified()) {
        const auto k = chunk_keys(job.digests[first + i]);
        keys.insert(keys.end(), k.begin(), k.end());
        for (const auto& part : parts_)
          for (std::size_t c = 0; c < part.chunks.size(); ++c) {
            words.push_back(part.offsets[c + 1] - part.offsets[c]);
            const PageId page = job.pages[first + i];
            dest.push_back(part.pool->page_unified() ? part.pool->row_data(page, true) + part.pool->object_offset(part.spans[c])
                                                     : nullptr);
          }
      } else {
        if (draft_) {
          keys.push_back(job.keys[first + i] + DraftState::kObjectSuffix);
          words.push_back(draft_->object_bytes() / sizeof(std::uint64_t));
        }
        keys.push_back(job.keys[first + i]);
        words.push_back(host_kv_.layer_block_bytes() * host_kv_.layers() / sizeof(std::uint64_t));
      }
    }
    item_end[i] = keys.size();
  }
  dest.resize(words.size(), nullptr);  // (rank_suffix keys: every object through the buffer)
  std::size_t total = 0;
  for (std::size_t o = 0; o < words.size(); ++o) total += dest[o] ? 0 : words[o];
  std::vector<std::uint64_t> buf(total);
  std::vector<std::span<std::uint8_t>> outs;
  std::size_t at = 0;  // (a part's buffered objects of one page stay contiguous: unpack reads them so)
  for (std::size_t o = 0; o < words.size(); ++o) {
    std::uint64_t* to = dest[o] ? dest[o] : buf.data() + at;
    outs.push_back(std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(to), words[o] * sizeof(std::uint64_t)));
    if (!dest[o]) at += words[o];
  }
  const std::size_t intact = ctx_.store.get_batch(keys, outs);
  std::size_t obj = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (item_end[i] > intact) return i;
    const PageId page = job.pages[first + i];
    if (obj == item_end[i]) continue;  // owned elsewhere
    if (unified()) {
      for (const auto& part : parts_) {  // each part's chunks are consecutive objects, in span order
        if (part.pool->page_unified()) {  // landed in place
          obj += part.chunks.size();
          continue;
        }
        part.pool->unpack(std::span<const PageId>(&page, 1), part.spans, reinterpret_cast<const std::uint64_t*>(outs[obj].data()),
                          /*kokkos=*/!ctx_.cfg.threaded);
        obj += part.chunks.size();
      }
      continue;
    }
    if (draft_) draft_->load_object(page, outs[obj++]);
    const std::size_t block = host_kv_.layer_block_bytes();
    for (std::size_t l = 0; l < host_kv_.layers(); ++l) std::memcpy(host_kv_.layer_block(page, l), outs[obj].data() + l * block, block);
    ++obj;
  }
  return n;
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
  pl->digests = digests_for(pl->tokens, pl->start);
  pl->keys = keys_for(pl->digests);
  pl->local_hit = pl->keys.size();
  if (!ctx_.cfg.writer) return pl;  // MLA readers (unified: CP replicas too): the writer decides
  // The leading pages whose objects all exist: the target's (unified: every chunk's) and a sidecar
  // draft's. CP sharding: this rank looks up only the pages it owns (the others count as present
  // here; their owners look them up), so the MIN over the shard group is the leading hit of all.
  ObjectStore& store = ctx_.store;
  auto stored = [&](std::size_t i) {
    if (unified()) {
      for (const auto& k : chunk_keys(pl->digests[i]))
        if (!store.exists(k)) return false;
      return true;
    }
    return store.exists(pl->keys[i]) && (!draft_ || store.exists(pl->keys[i] + DraftState::kObjectSuffix));
  };
  const CpPlacement& plc = host_kv_.placement();
  for (std::size_t i = 0; i < pl->keys.size(); ++i) {
    if (host_kv_.sharded() && (pl->start + i) % plc.shards != host_kv_.shard_rank()) continue;
    if (!stored(i)) {
      pl->local_hit = i;
      break;
    }
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
