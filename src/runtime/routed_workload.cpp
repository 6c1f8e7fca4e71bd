#include "runtime/routed_workload.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <cstdio>
#include <map>
#include <thread>

#include "core/check.hpp"
#include "core/hash.hpp"

namespace kvgrid {

namespace {

namespace fs = std::filesystem;

class RoutedWorkload final : public ServeWorkload {
 public:
  RoutedWorkload(std::unique_ptr<ServeWorkload> all, const WorkloadConfig& cfg)
      : all_(std::move(all)), min_(static_cast<std::size_t>(cfg.route_min_prompt)),
        max_(cfg.route_max_prompt > 0 ? static_cast<std::size_t>(cfg.route_max_prompt) : ~std::size_t{0}),
        dir_(cfg.route_dir), wait_s_(cfg.route_wait_s) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) throw InputError(dir_ + ": cannot create the router directory: " + ec.message());
  }

  std::vector<RequestSpec> arrivals(std::uint64_t now_ns) override {
    std::vector<RequestSpec> mine;
    for (bool more = true; more;) {
      more = poll(now_ns) > 0;
      for (auto& r : all_->arrivals(now_ns)) {
        const std::uint64_t name = identity(r);
        if (r.prompt.size() >= min_ && r.prompt.size() < max_) {
          mine_[r.id.value()] = name;
          mine.push_back(std::move(r));
        } else {
          elsewhere_[r.id.value()] = name;
          ++routed_away_;
          more = true;  // its marker may be there already
        }
      }
      pass_session_events();
    }
    return mine;
  }
  std::optional<std::uint64_t> next_arrival_ns() const override { return all_->next_arrival_ns(); }
  void make_ahead() override { all_->make_ahead(); }
  bool exhausted() const override { return all_->exhausted() && elsewhere_.empty(); }
  void finished(RequestId id, std::uint64_t now_ns) override {
    all_->finished(id, now_ns);
    pass_session_events();
    // The marker another bucket's job waits for (created whole: a name, no content).
    const auto it = mine_.find(id.value());
    KVGRID_CHECK(it != mine_.end(), "finish of request ", id, " this bucket did not serve");
    const std::string path = marker(it->second);
    mine_.erase(it);
    const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (fd >= 0) ::close(fd);
  }
  std::uint64_t total_requests() const override { return all_->total_requests() - routed_away_; }

  void wait_for_arrival(std::uint64_t now_ns) override {
    if (elsewhere_.empty() || all_->next_arrival_ns()) return;
    const auto start = std::chrono::steady_clock::now();
    auto pause = std::chrono::microseconds(200);
    while (poll(now_ns) == 0) {
      if (std::chrono::steady_clock::now() - start > std::chrono::duration<double>(wait_s_)) {
        std::cerr << "kvgrid: warning: no job finished request(s) routed to another bucket within workload.route_wait_s = "
                  << wait_s_ << " s (is the other bucket's job running over " << dir_ << "?); going on without them\n";
        for (const auto& [id, name] : elsewhere_) all_->finished(RequestId(id), now_ns);
        elsewhere_.clear();
        break;
      }
      std::this_thread::sleep_for(pause);  // another process's progress: nothing to wait on but its files
      pause = std::min(pause * 2, std::chrono::microseconds(20000));
    }
    pass_session_events();
  }

 private:
  // A request's name across jobs: its id depends on the order in which this job saw earlier turns
  // finish, its prompt (the whole history and the new turn) and turn do not.
  static std::uint64_t identity(const RequestSpec& r) {
    return hash_combine(hash_u32(std::span<const std::uint32_t>(r.prompt.data(), r.prompt.size())), r.round);
  }
  std::string marker(std::uint64_t name) const {
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(name));
    return dir_ + "/done-" + hex;
  }
  // Requests served elsewhere whose markers appeared: finished here now. Returns how many.
  std::size_t poll(std::uint64_t now_ns) {
    std::size_t n = 0;
    for (auto it = elsewhere_.begin(); it != elsewhere_.end();) {
      std::error_code ec;
      if (fs::exists(marker(it->second), ec)) {
        all_->finished(RequestId(it->first), now_ns);
        it = elsewhere_.erase(it);
        ++n;
      } else {
        ++it;
      }
    }
    return n;
  }
  void pass_session_events() {
    for (const auto& e : all_->take_session_events()) events_.push_back(e);
  }

  std::unique_ptr<ServeWorkload> all_;
  std::size_t min_, max_;
  std::string dir_;
  double wait_s_;
  std::map<std::uint64_t, std::uint64_t> elsewhere_;  // id -> name: routed away, not yet finished by their job
  std::map<std::uint64_t, std::uint64_t> mine_;       // id -> name: served here, not yet finished
  std::uint64_t routed_away_ = 0;
};

}  // namespace

std::unique_ptr<ServeWorkload> route_by_length(std::unique_ptr<ServeWorkload> all, const WorkloadConfig& cfg) {
  if (cfg.route_dir.empty()) return all;
  return std::make_unique<RoutedWorkload>(std::move(all), cfg);
}

}  // namespace kvgrid
