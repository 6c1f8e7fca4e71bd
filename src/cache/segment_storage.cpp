#include "cache/segment_storage.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "cache/file_io.hpp"
#include "cache/file_storage.hpp"  // sweep_directory
#include "core/check.hpp"

namespace kvgrid::cache {

namespace fs = std::filesystem;

namespace {

constexpr char kSegMagic[8] = {'K', 'V', 'G', 'R', 'I', 'D', 'S', '1'};
constexpr std::uint32_t kSegVersion = 1;
constexpr std::uint64_t kMaxIndexBytes = 64ULL << 20;

struct SegmentHead {
  char magic[8];
  std::uint32_t version;
  std::uint32_t count;
  std::uint64_t index_bytes;
  std::uint64_t index_checksum;
};
static_assert(sizeof(SegmentHead) == 32);

struct IndexEntry {
  std::uint64_t offset, length;
  std::uint32_t key_len, zero;
};
static_assert(sizeof(IndexEntry) == 24);

bool is_segment_name(const std::string& n) {
  return n.size() > 4 && n[0] != '.' && n.compare(n.size() - 4, 4, ".seg") == 0;
}

struct Listed {
  std::string key;
  std::uint64_t offset, length;
  std::size_t at;  // the entry's position in the index bytes
};

// A segment's head and index (`raw`: the index bytes); false unless both are whole and valid.
bool read_index(int fd, SegmentHead* head, std::vector<std::uint8_t>* raw, std::vector<Listed>* out) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || ::pread(fd, head, sizeof(*head), 0) != static_cast<ssize_t>(sizeof(*head))) return false;
  const SegmentHead& h = *head;
  if (std::memcmp(h.magic, kSegMagic, sizeof(kSegMagic)) != 0 || h.version != kSegVersion) return false;
  if (h.index_bytes > kMaxIndexBytes || sizeof(h) + h.index_bytes > static_cast<std::uint64_t>(st.st_size) ||
      h.index_bytes < std::uint64_t{h.count} * sizeof(IndexEntry))
    return false;
  raw->assign(h.index_bytes, 0);
  iovec iov{raw->data(), raw->size()};
  if (read_all(fd, &iov, 1, raw->size(), sizeof(h)) != raw->size() || payload_checksum(*raw) != h.index_checksum) return false;
  std::size_t at = 0;
  for (std::uint32_t i = 0; i < h.count; ++i) {
    IndexEntry e{};
    if (at + sizeof(e) > raw->size()) return false;
    std::memcpy(&e, raw->data() + at, sizeof(e));
    if (e.key_len > 4096 || at + sizeof(e) + e.key_len > raw->size()) return false;
    out->push_back({std::string(reinterpret_cast<const char*>(raw->data() + at + sizeof(e)), e.key_len), e.offset, e.length, at});
    at += sizeof(e) + e.key_len;
  }
  return true;
}

// Clips a scatter list to its first `n` bytes.
int clip(iovec* iov, int count, std::size_t n) {
  int i = 0;
  for (; i < count && n > 0; ++i) {
    iov[i].iov_len = std::min(iov[i].iov_len, n);
    n -= iov[i].iov_len;
  }
  return i;
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

SegmentStorage::SegmentStorage(std::string dir, std::uint64_t capacity_bytes, bool evicts)
    : dir_(std::move(dir)), capacity_(capacity_bytes), evicts_(evicts) {
  std::random_device rd;
  writer_id_ = (std::uint64_t{rd()} << 32) ^ rd() ^ (static_cast<std::uint64_t>(::getpid()) << 16);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw InputError(dir_ + ": cannot create the storage directory: " + ec.message());
  std::vector<std::pair<fs::file_time_type, std::string>> found;  // adopted oldest first
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    std::error_code e1;
    if (e.is_regular_file(e1) && is_segment_name(e.path().filename().string())) {
      const auto t = e.last_write_time(e1);
      if (!e1) found.push_back({t, e.path().filename().string()});
    }
  }
  std::sort(found.begin(), found.end());
  for (const auto& [t, name] : found) adopt(name, /*listed=*/true);
}

void SegmentStorage::set_fsync(bool on) {
  if (!on) return dir_sync_.close();
  if (!dir_sync_.open(dir_)) throw InputError(dir_ + ": cannot open the storage directory to sync it (cache.storage_fsync)");
}

bool SegmentStorage::adopt(const std::string& name, bool listed) {
  SegmentHead head{};
  std::vector<std::uint8_t> raw;
  std::vector<Listed> entries;
  const int fd = ::open(path(name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = read_index(fd, &head, &raw, &entries);
  ::close(fd);
  std::lock_guard<std::mutex> g(mu_);
  if (seg_ids_.count(name)) return true;
  const std::uint64_t id = next_seg_++;
  seg_ids_[name] = id;  // a damaged segment is remembered too: never read, never listed again
  if (!ok) return false;
  Segment& s = segs_[id];
  s.name = name;
  s.written = true;
  for (const auto& l : entries) {
    if (index_.count(l.key)) continue;  // the same object in an earlier segment, or this store's own
    if (!listed) {  // readable, not this store's to list or evict (as another's file is to FileStorage)
      if (readable_.emplace(l.key, Where{id, l.offset, l.length}).second) s.keys.push_back(l.key);
      continue;
    }
    readable_.erase(l.key);
    lru_.push_back(l.key);
    index_[l.key] = Entry{std::prev(lru_.end()), l.length, id, l.offset, l.length};
    used_ += l.length;
    s.keys.push_back(l.key);
    ++s.live;
  }
  if (s.keys.empty()) segs_.erase(id);
  return true;
}

void SegmentStorage::refresh() {
  std::lock_guard<std::mutex> scan(scan_mu_);
  struct stat st {};
  if (::stat(dir_.c_str(), &st) != 0) return;
  const std::int64_t mtime = std::int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
  const std::int64_t now = now_ns();
  {
    // Unchanged since a listing that began well after the last change (a change within the
    // filesystem's timestamp granularity of the listing could share its time): nothing new.
    std::lock_guard<std::mutex> g(mu_);
    if (mtime == scanned_mtime_ns_ && scanned_at_ns_ - mtime > 100'000'000) return;
  }
  std::vector<std::string> listed;
  if (DIR* d = ::opendir(dir_.c_str())) {
    while (const dirent* e = ::readdir(d))
      if (is_segment_name(e->d_name)) listed.emplace_back(e->d_name);
    ::closedir(d);
  }
  std::vector<std::string> fresh;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& n : listed)
      if (!seg_ids_.count(n)) fresh.push_back(std::move(n));
  }
  for (const auto& n : fresh) adopt(n, shared_);
  std::lock_guard<std::mutex> g(mu_);
  scanned_mtime_ns_ = mtime;
  scanned_at_ns_ = now;
}

bool SegmentStorage::locate(const std::string& key, Found* f, bool listed_only) {
  std::lock_guard<std::mutex> g(mu_);
  Where w{};
  if (auto it = index_.find(key); it != index_.end()) {
    w = Where{it->second.seg, it->second.offset, it->second.length};
  } else if (auto r = readable_.find(key); !listed_only && r != readable_.end()) {
    w = r->second;
  } else {
    return false;
  }
  auto s = segs_.find(w.seg);
  if (s == segs_.end() || !s->second.written) return false;  // its batch is still being written
  *f = Found{path(s->second.name), w.seg, w.offset, w.length};
  return true;
}

bool SegmentStorage::find(const std::string& key, Found* f) {
  if (locate(key, f)) return true;
  refresh();
  return locate(key, f);
}

void SegmentStorage::release_locked(Segment& s, std::uint64_t id) {
  if (--s.live > 0) return;
  ::unlink(path(s.name).c_str());
  segs_.erase(id);
}

void SegmentStorage::evict_locked(const std::string& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  const std::uint64_t seg = it->second.seg;
  lru_.erase(it->second.pos);
  used_ -= it->second.bytes;
  index_.erase(it);
  ++stats_.evicted;
  auto s = segs_.find(seg);
  if (s != segs_.end() && s->second.written) release_locked(s->second, seg);
}

void SegmentStorage::drop_segment_locked(std::uint64_t seg) {
  auto s = segs_.find(seg);
  if (s == segs_.end()) return;
  for (const auto& key : s->second.keys) {
    if (auto r = readable_.find(key); r != readable_.end() && r->second.seg == seg) readable_.erase(r);
    auto it = index_.find(key);
    if (it == index_.end() || it->second.seg != seg) continue;
    lru_.erase(it->second.pos);
    used_ -= it->second.bytes;
    index_.erase(it);
  }
  segs_.erase(s);
}

bool SegmentStorage::set(const std::string& key, std::span<const std::uint8_t> payload) {
  const std::string keys[1] = {key};
  const std::span<const std::uint8_t> payloads[1] = {payload};
  return set_batch(keys, payloads)[0];
}

std::vector<bool> SegmentStorage::set_batch(std::span<const std::string> keys,
                                            std::span<const std::span<const std::uint8_t>> payloads) {
  std::vector<bool> ok(keys.size(), false);
  std::vector<std::size_t> todo;  // the batch's new objects, in order
  std::uint64_t id = 0;
  std::string name;
  {
    // Decide everything under the lock, per object in order, as a file per object would: an
    // existing key is refreshed, room is made by evicting, space is reserved.
    std::lock_guard<std::mutex> g(mu_);
    id = next_seg_++;
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%016llx-%llu.seg", static_cast<unsigned long long>(writer_id_),
                  static_cast<unsigned long long>(++batches_));
    name = buf;
    seg_ids_[name] = id;
    segs_[id].name = name;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::uint64_t bytes = sizeof(ObjectHeader) + keys[i].size() + payloads[i].size();
      auto it = index_.find(keys[i]);
      if (it != index_.end()) {
        lru_.splice(lru_.end(), lru_, it->second.pos);
        ++stats_.set_skipped;
        ok[i] = true;
        continue;
      }
      while (evicts_ && used_ + bytes > capacity_ && !lru_.empty()) {
        const std::string victim = lru_.front();
        evict_locked(victim);
      }
      if (evicts_ && bytes > capacity_) {
        ++stats_.set_failed;
        continue;
      }
      readable_.erase(keys[i]);  // written by this store now: its own
      lru_.push_back(keys[i]);
      // (offset: until written, which of the batch's writes this reservation is — a key evicted
      // within its own batch and reserved again is held by its last write only)
      index_[keys[i]] = Entry{std::prev(lru_.end()), bytes, id, todo.size(), bytes};
      used_ += bytes;
      todo.push_back(i);
    }
    if (todo.empty()) {
      segs_.erase(id);
      return ok;
    }
  }
  // The head and index, then each object in the object format: one write each (no gather of the
  // whole batch: the kernel copies a large gather slower here), close, rename into place.
  std::vector<ObjectHeader> headers;
  std::vector<std::uint64_t> offsets, lengths;
  std::size_t index_bytes = 0;
  for (const std::size_t i : todo) index_bytes += sizeof(IndexEntry) + keys[i].size();
  std::vector<std::uint8_t> head(sizeof(SegmentHead) + index_bytes);
  std::uint64_t offset = head.size();
  std::size_t at = sizeof(SegmentHead);
  for (const std::size_t i : todo) {
    headers.push_back(make_header(keys[i], payloads[i], job_));
    const IndexEntry e{offset, sizeof(ObjectHeader) + keys[i].size() + payloads[i].size(),
                       static_cast<std::uint32_t>(keys[i].size()), 0};
    std::memcpy(head.data() + at, &e, sizeof(e));
    std::memcpy(head.data() + at + sizeof(e), keys[i].data(), keys[i].size());
    at += sizeof(e) + keys[i].size();
    offsets.push_back(offset);
    lengths.push_back(e.length);
    offset += e.length;
  }
  SegmentHead h{};
  std::memcpy(h.magic, kSegMagic, sizeof(kSegMagic));
  h.version = kSegVersion;
  h.count = static_cast<std::uint32_t>(todo.size());
  h.index_bytes = index_bytes;
  h.index_checksum = payload_checksum(std::span<const std::uint8_t>(head).subspan(sizeof(SegmentHead)));
  std::memcpy(head.data(), &h, sizeof(h));

  const std::string tmp = path(".tmp." + name);
  bool good = false;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd >= 0) {
    iovec hv{head.data(), head.size()};
    good = write_all(fd, &hv, 1, head.size());
    for (std::size_t j = 0; good && j < todo.size(); ++j) {
      const std::size_t i = todo[j];
      iovec iov[3] = {{&headers[j], sizeof(ObjectHeader)}, {const_cast<char*>(keys[i].data()), keys[i].size()},
                      {const_cast<std::uint8_t*>(payloads[i].data()), payloads[i].size()}};
      good = write_all(fd, iov, 3, lengths[j]);
    }
    if (dir_sync_.is_open()) good = good && sync_data(fd);  // cache.storage_fsync: the bytes before the name
    good = ::close(fd) == 0 && good;
    const bool renamed = good && ::rename(tmp.c_str(), path(name).c_str()) == 0;  // atomic: the whole batch or none
    good = renamed && dir_sync_.sync();
    if (renamed && !good) ::unlink(path(name).c_str());  // its name never reached stable storage: not written
  }
  if (!good) ::unlink(tmp.c_str());

  std::lock_guard<std::mutex> g(mu_);
  Segment& s = segs_[id];
  for (std::size_t j = 0; j < todo.size(); ++j) {
    const std::size_t i = todo[j];
    auto it = index_.find(keys[i]);
    const bool held = it != index_.end() && it->second.seg == id && it->second.offset == j;  // not evicted meanwhile
    if (!good) {
      if (held) {
        lru_.erase(it->second.pos);
        used_ -= it->second.bytes;
        index_.erase(it);
      }
      ++stats_.set_failed;
      continue;
    }
    if (held) {
      it->second.offset = offsets[j];
      s.keys.push_back(keys[i]);
      ++s.live;
    }
    ++stats_.sets;
    stats_.bytes_written += lengths[j];
    ok[i] = true;
  }
  if (good && s.live > 0) {
    s.written = true;
  } else {
    if (good) ::unlink(path(name).c_str());  // every object evicted meanwhile
    segs_.erase(id);
  }
  return ok;
}

StorageMiss SegmentStorage::get(const std::string& key, std::span<std::uint8_t> out) {
  auto miss = [&](StorageMiss m) {
    std::lock_guard<std::mutex> g(mu_);
    count_read(stats_, m);
    return m;
  };
  Found f;
  if (!find(key, &f)) return miss(StorageMiss::Missing);
  const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {  // swept: forget its objects (another error, e.g. no file descriptor left, is this read's miss only)
      std::lock_guard<std::mutex> g(mu_);
      drop_segment_locked(f.seg);
    }
    return miss(StorageMiss::Missing);
  }
  // One scattered read straight into `out`, of the object's bytes as the index gives them.
  ObjectHeader h{};
  std::string stored(key.size(), '\0');
  const std::size_t want = sizeof(h) + key.size() + out.size();
  const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(f.length, want));
  iovec iov[3] = {{&h, sizeof(h)}, {stored.data(), stored.size()}, {out.data(), out.size()}};
  const int parts = clip(iov, 3, n);
  const std::size_t got = read_all(fd, iov, parts, n, static_cast<off_t>(f.offset));
  if (recency_on_disk_ && got == want && f.length == want) ::futimens(fd, nullptr);  // read now: last in a sweep's order
  ::close(fd);
  const StorageMiss m = check_scattered_read(h, stored, key, out, got, f.length > want);
  std::lock_guard<std::mutex> g(mu_);
  count_read(stats_, m, out.size(), h.job != job_);
  if (auto it = index_.find(key); m == StorageMiss::None && it != index_.end()) lru_.splice(lru_.end(), lru_, it->second.pos);
  return m;
}

bool SegmentStorage::exists(const std::string& key) {
  Found f;
  if (locate(key, &f, /*listed_only=*/true)) {
    struct stat st {};
    if ((shared_ || !evicts_) && ::stat(f.path.c_str(), &st) != 0) {  // a store a sweep keeps: still there?
      if (errno == ENOENT) {
        std::lock_guard<std::mutex> g(mu_);
        drop_segment_locked(f.seg);
      }
      return false;
    }
    return true;
  }
  if (!shared_) return false;
  refresh();
  return locate(key, &f, true);
}

SweepResult SegmentStorage::sweep(std::uint64_t limit_bytes) {
  const SweepResult r = sweep_directory(dir_, limit_bytes);
  if (r.removed == 0) return r;
  std::lock_guard<std::mutex> g(mu_);
  std::vector<std::uint64_t> gone;
  for (const auto& [id, s] : segs_)
    if (s.written && ::access(path(s.name).c_str(), F_OK) != 0) gone.push_back(id);
  for (const auto id : gone) drop_segment_locked(id);
  return r;
}

void SegmentStorage::truncate(const std::string& key) {
  Found f;
  if (!find(key, &f)) return;
  const int fd = ::open(f.path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return;
  SegmentHead h{};
  std::vector<std::uint8_t> raw;
  std::vector<Listed> listed;
  if (read_index(fd, &h, &raw, &listed))
    for (const auto& l : listed) {
      if (l.key != key || l.offset != f.offset) continue;
      IndexEntry e{};
      std::memcpy(&e, raw.data() + l.at, sizeof(e));
      e.length /= 2;  // what a reader gets of it from now on
      std::memcpy(raw.data() + l.at, &e, sizeof(e));
      h.index_checksum = payload_checksum(raw);
      iovec iov[2] = {{&h, sizeof(h)}, {raw.data(), raw.size()}};
      if (::pwritev(fd, iov, 2, 0) == static_cast<ssize_t>(sizeof(h) + raw.size())) {
        std::lock_guard<std::mutex> g(mu_);
        if (auto it = index_.find(key); it != index_.end() && it->second.seg == f.seg) it->second.length = e.length;
        if (auto r = readable_.find(key); r != readable_.end() && r->second.seg == f.seg) r->second.length = e.length;
      }
      break;
    }
  ::close(fd);
}

void SegmentStorage::corrupt(const std::string& key) {
  Found f;
  if (!find(key, &f) || f.length < 2) return;
  const int fd = ::open(f.path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return;
  const off_t last = static_cast<off_t>(f.offset + f.length - 1);  // the payload's last byte: only the checksum can tell
  char c = 0;
  if (::pread(fd, &c, 1, last) == 1) {
    c = static_cast<char>(c ^ 0x5a);
    (void)!::pwrite(fd, &c, 1, last);
  }
  ::close(fd);
}

StorageStats SegmentStorage::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
}

std::uint64_t SegmentStorage::used_bytes() const {
  std::lock_guard<std::mutex> g(mu_);
  return used_;
}

std::size_t SegmentStorage::segments() const {
  std::lock_guard<std::mutex> g(mu_);
  std::size_t n = 0;
  for (const auto& [id, s] : segs_) n += s.written && s.live > 0;
  return n;
}

std::string SegmentStorage::segment_of(const std::string& key) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return "";
  auto s = segs_.find(it->second.seg);
  return s == segs_.end() || !s->second.written ? "" : s->second.name;
}

}  // namespace kvgrid::cache
