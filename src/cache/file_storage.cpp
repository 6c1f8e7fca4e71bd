#include "cache/file_storage.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/check.hpp"
#include "core/hash.hpp"

namespace kvgrid::cache {

namespace fs = std::filesystem;

namespace {
constexpr char kMagic[8] = {'K', 'V', 'G', 'R', 'I', 'D', 'O', '1'};
constexpr std::uint32_t kVersion = 1;

struct Header {
  char magic[8];
  std::uint32_t version;
  std::uint32_t key_len;
  std::uint64_t payload_len;
  std::uint64_t checksum;
  std::uint64_t job;  // the writing job (FileStorage::set_job; 0: not named)
};
static_assert(sizeof(Header) == 40);
}  // namespace

const char* storage_miss_name(StorageMiss m) {
  switch (m) {
    case StorageMiss::None: return "hit";
    case StorageMiss::Missing: return "missing";
    case StorageMiss::Short: return "short";
    case StorageMiss::Corrupt: return "corrupt";
    case StorageMiss::WrongKey: return "wrong key";
    case StorageMiss::WrongLength: return "wrong length";
  }
  return "?";
}

std::uint64_t payload_checksum(std::span<const std::uint8_t> bytes) {
  std::uint64_t h = mix64(bytes.size());
  std::size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, bytes.data() + i, 8);
    h = (h ^ w) * 0x9fb21c651e98df25ULL;
    h ^= h >> 32;
  }
  for (; i < bytes.size(); ++i) h = (h ^ bytes[i]) * 0x100000001b3ULL;
  return mix64(h);
}

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

std::string FileStorage::path_of(const std::string& key) const { return (fs::path(dir_) / (key + ".bin")).string(); }

void FileStorage::touch_locked(const std::string& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  lru_.splice(lru_.end(), lru_, it->second.pos);
}

bool FileStorage::set(const std::string& key, std::span<const std::uint8_t> payload) {
  const std::uint64_t bytes = sizeof(Header) + key.size() + payload.size();
  std::string tmp;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (index_.count(key)) {
      touch_locked(key);
      ++stats_.set_skipped;
      return true;
    }
    // Make room (never evicting more than the whole store).
    while (evicts_ && used_ + bytes > capacity_ && !lru_.empty()) {
      const std::string victim = lru_.front();
      lru_.pop_front();
      used_ -= index_[victim].bytes;
      index_.erase(victim);
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
    index_[key] = Entry{std::prev(lru_.end()), bytes};
    used_ += bytes;
  }
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kVersion;
  h.key_len = static_cast<std::uint32_t>(key.size());
  h.payload_len = payload.size();
  h.checksum = payload_checksum(payload);
  h.job = job_;
  bool ok = false;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&h), sizeof(h));
    out.write(key.data(), static_cast<std::streamsize>(key.size()));
    out.write(reinterpret_cast<const char*>(payload.data()), static_cast<std::streamsize>(payload.size()));
    out.close();
    ok = static_cast<bool>(out);
  }
  std::error_code ec;
  if (ok) fs::rename(tmp, path_of(key), ec);  // atomic: readers see the old or the new object
  if (!ok || ec) {
    fs::remove(tmp, ec);
    std::lock_guard<std::mutex> g(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.erase(it->second.pos);
      used_ -= it->second.bytes;
      index_.erase(it);
    }
    ++stats_.set_failed;
    return false;
  }
  std::lock_guard<std::mutex> g(mu_);
  ++stats_.sets;
  stats_.bytes_written += bytes;
  return true;
}

StorageMiss FileStorage::get(const std::string& key, std::span<std::uint8_t> out) {
  auto miss = [&](StorageMiss m) {
    std::lock_guard<std::mutex> g(mu_);
    ++stats_.gets;
    if (m == StorageMiss::Missing) ++stats_.missing;
    else if (m == StorageMiss::Short) ++stats_.short_reads;
    else ++stats_.corrupt;
    return m;
  };
  std::ifstream in(path_of(key), std::ios::binary);
  if (!in) return miss(StorageMiss::Missing);
  Header h{};
  in.read(reinterpret_cast<char*>(&h), sizeof(h));
  if (in.gcount() != static_cast<std::streamsize>(sizeof(h))) return miss(StorageMiss::Short);
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || h.version != kVersion || h.key_len > 4096)
    return miss(StorageMiss::Corrupt);
  std::string stored(h.key_len, '\0');
  in.read(stored.data(), static_cast<std::streamsize>(stored.size()));
  if (in.gcount() != static_cast<std::streamsize>(stored.size())) return miss(StorageMiss::Short);
  if (stored != key) return miss(StorageMiss::WrongKey);
  if (h.payload_len != out.size()) return miss(StorageMiss::WrongLength);
  std::vector<std::uint8_t> buf(out.size());
  in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
  if (in.gcount() != static_cast<std::streamsize>(buf.size())) return miss(StorageMiss::Short);
  if (payload_checksum(buf) != h.checksum) return miss(StorageMiss::Corrupt);
  std::memcpy(out.data(), buf.data(), buf.size());
  std::lock_guard<std::mutex> g(mu_);
  ++stats_.gets;
  ++stats_.hits;
  if (h.job != job_) ++stats_.other_job_hits;
  stats_.bytes_read += buf.size();
  touch_locked(key);
  return StorageMiss::None;
}

bool FileStorage::exists(const std::string& key) {
  bool indexed;
  {
    std::lock_guard<std::mutex> g(mu_);
    indexed = index_.count(key) > 0;
  }
  if (!indexed && !shared_) return false;
  std::error_code ec;
  const auto bytes = fs::file_size(path_of(key), ec);
  if (ec) return false;
  if (!indexed) {  // another job's object, written since this store was opened
    std::lock_guard<std::mutex> g(mu_);
    if (!index_.count(key)) {
      lru_.push_back(key);
      index_[key] = Entry{std::prev(lru_.end()), bytes};
      used_ += bytes;
    }
  }
  return true;
}

std::size_t FileStorage::batch_exists(std::span<const std::string> keys) {
  std::size_t n = 0;
  while (n < keys.size() && exists(keys[n])) ++n;
  return n;
}

StorageStats FileStorage::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
}

std::uint64_t FileStorage::used_bytes() const {
  std::lock_guard<std::mutex> g(mu_);
  return used_;
}

}  // namespace kvgrid::cache
