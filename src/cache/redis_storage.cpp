#include "cache/redis_storage.hpp"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <csignal>

#include <cstdarg>
#include <iostream>
#include <regex>

#include "core/check.hpp"

namespace kvgrid::cache {

namespace {
constexpr timeval kConnectTimeout{1, 0}, kCommandTimeout{5, 0};
constexpr auto kRetryPause = std::chrono::milliseconds(200);
}  // namespace

RedisStorage::Address RedisStorage::parse_url(const std::string& url) {
  static const std::regex re(R"(^redis://([A-Za-z0-9._-]+):([0-9]{1,5})(?:/([0-9]{1,2}))?$)");
  std::smatch m;
  if (!std::regex_match(url, m, re))
    throw InputError("cache.storage_url = \"" + url + "\": expected redis://HOST:PORT[/DB]");
  Address a;
  a.host = m[1];
  a.port = std::stoi(m[2]);
  if (a.port < 1 || a.port > 65535) throw InputError("cache.storage_url = \"" + url + "\": port out of range");
  if (m[3].matched) a.db = std::stoi(m[3]);
  return a;
}

RedisStorage::RedisStorage(std::string url) : url_(std::move(url)), addr_(parse_url(url_)) {
  // A server that goes away mid-write must be a failed command, not a SIGPIPE that kills the rank
  // (the storage writer's threads send SETs: storage_writer.hpp).
  std::signal(SIGPIPE, SIG_IGN);
}

RedisStorage::~RedisStorage() {
  if (ctx_) redisFree(ctx_);
}

RedisStorage::Probe RedisStorage::probe(const std::string& url) {
  Probe p;
  const Address a = parse_url(url);
  redisContext* c = redisConnectWithTimeout(a.host.c_str(), a.port, kConnectTimeout);
  if (!c || c->err) {
    p.error = c && c->errstr[0] ? c->errstr : "no connection";
    if (c) redisFree(c);
    return p;
  }
  redisSetTimeout(c, kCommandTimeout);
  auto ask = [&](const char* fmt, auto... args) {
    return static_cast<redisReply*>(redisCommand(c, fmt, args...));
  };
  bool ok = true;
  if (a.db != 0) {
    redisReply* r = ask("SELECT %d", a.db);
    ok = r && r->type != REDIS_REPLY_ERROR;
    if (r) freeReplyObject(r);
  }
  if (ok) {
    if (redisReply* r = ask("DBSIZE")) {
      if (r->type == REDIS_REPLY_INTEGER) p.keys = r->integer;
      freeReplyObject(r);
    }
    // ["maxmemory", "N"]: a server that refuses CONFIG (managed services rename it) stays unknown.
    auto config = [&](const char* name) -> std::optional<std::string> {
      std::optional<std::string> v;
      if (redisReply* r = ask("CONFIG GET %s", name)) {
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[1]->type == REDIS_REPLY_STRING)
          v = std::string(r->element[1]->str, r->element[1]->len);
        freeReplyObject(r);
      }
      return v;
    };
    if (auto m = config("maxmemory")) p.maxmemory = std::stoull(*m);
    if (auto pol = config("maxmemory-policy")) p.policy = *pol;
  }
  p.reachable = ok && p.keys >= 0;
  if (!p.reachable) p.error = c->errstr[0] ? c->errstr : "SELECT or DBSIZE refused";
  redisFree(c);
  return p;
}

bool RedisStorage::connected_locked() {
  if (ctx_) return true;
  if (std::chrono::steady_clock::now() < retry_at_) return false;
  ctx_ = redisConnectWithTimeout(addr_.host.c_str(), addr_.port, kConnectTimeout);
  if (!ctx_ || ctx_->err) {
    failed_locked("connect");
    return false;
  }
  redisSetTimeout(ctx_, kCommandTimeout);
  if (addr_.db != 0) {
    auto* r = static_cast<redisReply*>(redisCommand(ctx_, "SELECT %d", addr_.db));
    const bool ok = r && r->type != REDIS_REPLY_ERROR;
    if (r) freeReplyObject(r);
    if (!ok) {
      failed_locked("SELECT");
      return false;
    }
  }
  if (down_) std::cerr << "kvgrid: storage " << url_ << " reachable again\n";
  down_ = false;
  return true;
}

void RedisStorage::failed_locked(const char* what) {
  ++stats_.connection_errors;
  if (!down_)
    std::cerr << "kvgrid: storage " << url_ << ": " << what << " failed ("
              << (ctx_ && ctx_->errstr[0] ? ctx_->errstr : "no connection")
              << "): storage misses and failed writes until it is back\n";
  down_ = true;
  if (ctx_) redisFree(ctx_);
  ctx_ = nullptr;
  retry_at_ = std::chrono::steady_clock::now() + kRetryPause;
}

redisReply* RedisStorage::command_locked(const char* fmt, ...) {
  if (!connected_locked()) return nullptr;
  va_list ap;
  va_start(ap, fmt);
  auto* r = static_cast<redisReply*>(redisvCommand(ctx_, fmt, ap));
  va_end(ap);
  if (!r || r->type == REDIS_REPLY_ERROR) {
    if (r) freeReplyObject(r);
    failed_locked("command");
    return nullptr;
  }
  return r;
}

bool RedisStorage::set(const std::string& key, std::span<const std::uint8_t> payload) {
  const auto value = encode_object(key, payload, job_);
  std::lock_guard<std::mutex> g(mu_);
  redisReply* r = command_locked("SET %b %b NX", key.data(), key.size(), value.data(), value.size());
  if (!r) {
    ++stats_.set_failed;
    return false;
  }
  if (r->type == REDIS_REPLY_NIL) {
    ++stats_.set_skipped;  // there already: immutable
  } else {
    ++stats_.sets;
    stats_.bytes_written += value.size();
  }
  freeReplyObject(r);
  return true;
}

// One GET reply's outcome into the counters.
StorageMiss RedisStorage::take_reply_locked(redisReply* r, const std::string& key, std::span<std::uint8_t> out) {
  ++stats_.gets;
  StorageMiss m = StorageMiss::Missing;
  std::uint64_t job = 0;
  if (r && r->type == REDIS_REPLY_STRING)
    m = decode_object(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(r->str), r->len), key, out, &job);
  switch (m) {
    case StorageMiss::None:
      ++stats_.hits;
      stats_.bytes_read += out.size();
      if (job != job_) ++stats_.other_job_hits;
      break;
    case StorageMiss::Missing: ++stats_.missing; break;
    case StorageMiss::Short: ++stats_.short_reads; break;
    default: ++stats_.corrupt; break;
  }
  return m;
}

StorageMiss RedisStorage::get(const std::string& key, std::span<std::uint8_t> out) {
  std::lock_guard<std::mutex> g(mu_);
  redisReply* r = command_locked("GET %b", key.data(), key.size());
  const StorageMiss m = take_reply_locked(r, key, out);
  if (r) freeReplyObject(r);
  return m;
}

std::size_t RedisStorage::get_batch(std::span<const std::string> keys, std::span<const std::span<std::uint8_t>> outs) {
  if (keys.empty()) return 0;
  std::lock_guard<std::mutex> g(mu_);
  if (!connected_locked()) {
    stats_.gets += keys.size();
    stats_.missing += keys.size();
    return 0;
  }
  for (const auto& k : keys) redisAppendCommand(ctx_, "GET %b", k.data(), k.size());  // one round trip
  std::size_t lead = 0;
  bool still = true, broken = false;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    void* p = nullptr;
    if (broken || redisGetReply(ctx_, &p) != REDIS_OK || !p) {
      broken = true;
      take_reply_locked(nullptr, keys[i], outs[i]);
      continue;
    }
    auto* r = static_cast<redisReply*>(p);
    const bool ok = take_reply_locked(r, keys[i], outs[i]) == StorageMiss::None;
    freeReplyObject(r);
    if (still && ok) ++lead;
    else still = false;
  }
  if (broken) failed_locked("GET batch");  // the leading objects decoded before it stand
  return lead;
}

bool RedisStorage::exists(const std::string& key) {
  std::lock_guard<std::mutex> g(mu_);
  redisReply* r = command_locked("EXISTS %b", key.data(), key.size());
  const bool yes = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
  if (r) freeReplyObject(r);
  return yes;
}

std::size_t RedisStorage::batch_exists(std::span<const std::string> keys) {
  const auto there = present(keys);  // one pipelined round trip
  std::size_t lead = 0;
  while (lead < there.size() && there[lead]) ++lead;
  return lead;
}

std::vector<bool> RedisStorage::present(std::span<const std::string> keys) {
  std::vector<bool> out(keys.size(), false);
  if (keys.empty()) return out;
  std::lock_guard<std::mutex> g(mu_);
  if (!connected_locked()) return out;
  for (const auto& k : keys) redisAppendCommand(ctx_, "EXISTS %b", k.data(), k.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    void* p = nullptr;
    if (redisGetReply(ctx_, &p) != REDIS_OK || !p) {
      failed_locked("EXISTS batch");
      return std::vector<bool>(keys.size(), false);
    }
    auto* r = static_cast<redisReply*>(p);
    out[i] = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
  }
  return out;
}

std::vector<bool> RedisStorage::set_batch(std::span<const std::string> keys, std::span<const std::span<const std::uint8_t>> payloads) {
  std::vector<bool> out(keys.size(), false);
  if (keys.empty()) return out;
  std::vector<std::vector<std::uint8_t>> values;
  for (std::size_t i = 0; i < keys.size(); ++i) values.push_back(encode_object(keys[i], payloads[i], job_));
  std::lock_guard<std::mutex> g(mu_);
  if (!connected_locked()) {
    stats_.set_failed += keys.size();
    return out;
  }
  for (std::size_t i = 0; i < keys.size(); ++i)  // in order: a page's draft object before the target's
    redisAppendCommand(ctx_, "SET %b %b NX", keys[i].data(), keys[i].size(), values[i].data(), values[i].size());
  bool broken = false;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    void* p = nullptr;
    if (broken || redisGetReply(ctx_, &p) != REDIS_OK || !p) {
      broken = true;
      ++stats_.set_failed;
      continue;
    }
    auto* r = static_cast<redisReply*>(p);
    if (r->type == REDIS_REPLY_ERROR) {
      ++stats_.set_failed;
    } else {
      out[i] = true;
      if (r->type == REDIS_REPLY_NIL) {
        ++stats_.set_skipped;
      } else {
        ++stats_.sets;
        stats_.bytes_written += values[i].size();
      }
    }
    freeReplyObject(r);
  }
  if (broken) failed_locked("SET batch");
  return out;
}

void RedisStorage::truncate(const std::string& key) {
  std::lock_guard<std::mutex> g(mu_);
  redisReply* r = command_locked("GET %b", key.data(), key.size());
  if (!r) return;
  if (r->type == REDIS_REPLY_STRING && r->len > 8) {
    const std::string half(r->str, r->len / 2);
    freeReplyObject(r);
    if (redisReply* w = command_locked("SET %b %b", key.data(), key.size(), half.data(), half.size())) freeReplyObject(w);
    return;
  }
  freeReplyObject(r);
}

void RedisStorage::corrupt(const std::string& key) {
  std::lock_guard<std::mutex> g(mu_);
  redisReply* r = command_locked("STRLEN %b", key.data(), key.size());
  if (!r) return;
  const long long len = r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
  freeReplyObject(r);
  if (len < 2) return;
  redisReply* b = command_locked("GETRANGE %b %lld %lld", key.data(), key.size(), len - 1, len - 1);
  if (!b) return;
  if (b->type == REDIS_REPLY_STRING && b->len == 1) {  // the payload's last byte: only the checksum can tell
    const char c = static_cast<char>(b->str[0] ^ 0x5a);
    if (redisReply* w = command_locked("SETRANGE %b %lld %b", key.data(), key.size(), len - 1, &c, static_cast<std::size_t>(1)))
      freeReplyObject(w);
  }
  freeReplyObject(b);
}

StorageStats RedisStorage::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
}

}  // namespace kvgrid::cache
