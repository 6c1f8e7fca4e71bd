#include "cache/file_storage.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cache/file_io.hpp"
#include "core/check.hpp"
#include "core/hash.hpp"

namespace kvgrid::cache {

namespace fs = std::filesystem;


FileStorage::FileStorage(std::string dir, std::uint64_t capacity_bytes, bool evicts)
    : dir_(std::move(dir)), capacity_(capacity_bytes), evicts_(evicts) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw InputError(dir_ + ": cannot create the storage directory: " + ec.message());
  // Adopt existing objects, oldest first.
  std::vector<std::pair<fs::file_time_type, fs::path>> found;
  for (const auto& e : fs::directory_iterator(dir_, ec))
    if (e.is_regular_file() && e.path().extension() == ".bin") found.push_back({e.last_write_time(), e.path()});
  std::sort(found.begin(), found.end());
  for (const auto& [t, p] : found) {
    const std::string key = p.stem().string();
    const std::uint64_t bytes = fs::file_size(p, ec);
    lru_.push_back(key);
    index_[key] = Entry{std::prev(lru_.end()), bytes};
    used_ += bytes;
  }
}

void FileStorage::set_fsync(bool on) {
  if (!on) return dir_sync_.close();
  if (!dir_sync_.open(dir_)) throw InputError(dir_ + ": cannot open the storage directory to sync it (cache.storage_fsync)");
}

std::string FileStorage::path_of(const std::string& key) const { return (fs::path(dir_) / (key + ".bin")).string(); }

void FileStorage::touch_locked(const std::string& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  lru_.splice(lru_.end(), lru_, it->second.pos);
}

void FileStorage::forget_locked(const std::string& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  lru_.erase(it->second.pos);
  used_ -= it->second.bytes;
  index_.erase(it);
}

bool FileStorage::on_disk(const std::string& key) {
  if (!shared_ && evicts_) return true;  // only this instance removes its objects, and forgets them
  struct stat st {};
  if (::stat(path_of(key).c_str(), &st) == 0 || errno != ENOENT) return true;
  std::lock_guard<std::mutex> g(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  if (it->second.writing) return true;  // forgotten and set again meanwhile: its file is on the way
  forget_locked(key);
  return false;
}

bool FileStorage::set(const std::string& key, std::span<const std::uint8_t> payload) {
  const std::uint64_t bytes = sizeof(ObjectHeader) + key.size() + payload.size();
  std::string tmp;
  // An object the index holds is refreshed, not written again — unless a sweep removed it.
  bool present;
  {
    std::lock_guard<std::mutex> g(mu_);
    present = index_.count(key) > 0;
  }
  if (present) present = on_disk(key);  // (forgets a removed one)
  {
    std::lock_guard<std::mutex> g(mu_);
    if (present || index_.count(key)) {  // (or set, or adopted, by another thread meanwhile)
      touch_locked(key);
      ++stats_.set_skipped;
      return true;
    }
    // Make room (never evicting more than the whole store).
    while (evicts_ && used_ + bytes > capacity_ && !lru_.empty()) {
      const std::string victim = lru_.front();
      forget_locked(victim);
      std::error_code ec;
      fs::remove(path_of(victim), ec);
      ++stats_.evicted;
    }
    if (evicts_ && bytes > capacity_) {
      ++stats_.set_failed;
      return false;
    }
    tmp = (fs::path(dir_) / (".tmp." + std::to_string(::getpid()) + "." + std::to_string(++tmp_counter_) + "." + key)).string();
    // Reserve the space now so that concurrent writers do not overshoot the capacity.
    lru_.push_back(key);
    index_[key] = Entry{std::prev(lru_.end()), bytes, /*writing=*/true};
    used_ += bytes;
  }
  ObjectHeader h = make_header(key, payload, job_);
  // open, one gathered write, close, rename: no buffering layer, no fsync (the page cache, as dd).
  bool ok = false;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd >= 0) {
    iovec iov[3] = {{&h, sizeof(h)}, {const_cast<char*>(key.data()), key.size()},
                    {const_cast<std::uint8_t*>(payload.data()), payload.size()}};
    ok = write_all(fd, iov, 3, sizeof(h) + key.size() + payload.size());
    if (dir_sync_.is_open()) ok = ok && sync_data(fd);  // cache.storage_fsync: the bytes before the name
    ok = ::close(fd) == 0 && ok;
  }
  std::error_code ec;
  if (ok) fs::rename(tmp, path_of(key), ec);  // atomic: readers see the old or the new object
  if (ok && !ec && !dir_sync_.sync()) ec = std::make_error_code(std::errc::io_error);
  if (!ok || ec) {
    fs::remove(tmp, ec);
    std::lock_guard<std::mutex> g(mu_);
    forget_locked(key);
    ++stats_.set_failed;
    return false;
  }
  std::lock_guard<std::mutex> g(mu_);
  if (auto it = index_.find(key); it != index_.end()) it->second.writing = false;
  ++stats_.sets;
  stats_.bytes_written += bytes;
  return true;
}

StorageMiss FileStorage::get(const std::string& key, std::span<std::uint8_t> out) {
  auto miss = [&](StorageMiss m) {
    std::lock_guard<std::mutex> g(mu_);
    count_read(stats_, m);
    return m;
  };
  // open, one scattered read straight into `out` (plus one byte to see a longer file), close.
  const int fd = ::open(path_of(key).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return miss(StorageMiss::Missing);
  ObjectHeader h{};
  std::string stored(key.size(), '\0');
  char extra = 0;
  iovec iov[4] = {{&h, sizeof(h)}, {stored.data(), stored.size()}, {out.data(), out.size()}, {&extra, 1}};
  const std::size_t want = sizeof(h) + key.size() + out.size();
  const std::size_t got = read_all(fd, iov, 4, want + 1);
  if (recency_on_disk_ && got == want) ::futimens(fd, nullptr);  // read now: last in a sweep's order
  ::close(fd);
  const StorageMiss m = check_scattered_read(h, stored, key, out, got, got > want);
  std::lock_guard<std::mutex> g(mu_);
  count_read(stats_, m, out.size(), h.job != job_);
  if (m == StorageMiss::None) touch_locked(key);
  return m;
}

bool FileStorage::exists(const std::string& key) {
  bool indexed;
  {
    std::lock_guard<std::mutex> g(mu_);
    indexed = index_.count(key) > 0;
  }
  if (indexed) return on_disk(key);
  if (!shared_) return false;
  std::error_code ec;
  const auto bytes = fs::file_size(path_of(key), ec);
  if (ec) return false;
  std::lock_guard<std::mutex> g(mu_);  // another job's object, written since this store was opened
  if (!index_.count(key)) {
    lru_.push_back(key);
    index_[key] = Entry{std::prev(lru_.end()), bytes};
    used_ += bytes;
  }
  return true;
}


SweepResult sweep_directory(const std::string& dir, std::uint64_t limit_bytes, bool dry_run) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(dir + ": no such storage directory");
  struct Obj {
    fs::file_time_type t;
    std::string name;
    std::uint64_t bytes;
  };
  std::vector<Obj> objs;
  SweepResult r;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const auto ext = e.path().extension();
    if (name.rfind(".tmp.", 0) == 0 || (ext != ".bin" && ext != ".seg")) continue;  // objects and segments
    std::error_code e1, e2;
    const auto t = e.last_write_time(e1);
    const auto b = e.file_size(e2);
    if (e1 || e2) continue;  // removed meanwhile
    objs.push_back({t, name, b});
    r.bytes += b;
  }
  r.objects = objs.size();
  std::sort(objs.begin(), objs.end(), [](const Obj& a, const Obj& b) { return a.t != b.t ? a.t < b.t : a.name < b.name; });
  std::uint64_t left = r.bytes;
  for (const auto& o : objs) {
    if (left <= limit_bytes) break;
    std::error_code e3;
    if (!dry_run && !fs::remove(fs::path(dir) / o.name, e3)) continue;  // gone already
    left -= o.bytes;
    ++r.removed;
    r.removed_bytes += o.bytes;
  }
  return r;
}

StorageStats FileStorage::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
}

SweepResult FileStorage::sweep(std::uint64_t limit_bytes) {
  const SweepResult r = sweep_directory(dir_, limit_bytes);
  if (r.removed == 0) return r;
  std::vector<std::string> keys;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& [key, e] : index_)
      if (!e.writing) keys.push_back(key);
  }
  for (const auto& key : keys) {  // the index forgets what the sweep removed
    struct stat st {};
    if (::stat(path_of(key).c_str(), &st) != 0 && errno == ENOENT) {
      std::lock_guard<std::mutex> g(mu_);
      if (auto it = index_.find(key); it != index_.end() && !it->second.writing) forget_locked(key);
    }
  }
  return r;
}

void FileStorage::truncate(const std::string& key) {
  std::error_code ec;
  const auto path = path_of(key);
  const auto size = fs::file_size(path, ec);
  if (!ec && size > 8) fs::resize_file(path, size / 2, ec);
}

void FileStorage::corrupt(const std::string& key) {
  const int fd = ::open(path_of(key).c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return;
  const off_t size = ::lseek(fd, 0, SEEK_END);
  char c = 0;
  if (size >= 2 && ::pread(fd, &c, 1, size - 1) == 1) {  // the payload's last byte: only the checksum can tell
    c = static_cast<char>(c ^ 0x5a);
    (void)!::pwrite(fd, &c, 1, size - 1);
  }
  ::close(fd);
}

std::uint64_t FileStorage::used_bytes() const {
  std::lock_guard<std::mutex> g(mu_);
  return used_;
}

}  // namespace kvgrid::cache
