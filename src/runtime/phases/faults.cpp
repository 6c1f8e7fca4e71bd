// Phase `faults`: the debug knobs (kill a rank, plant a divergence) and the failpoints drawn at the
// start of a step (rank.stall, device.page.corrupt).
#include <csignal>
#include <thread>

#include "runtime/rank_check.hpp"
#include "runtime/serve_loop.hpp"

namespace kvgrid {

void ServeLoop::faults(Step& s) {
  const std::int64_t step = s.index;
  const auto at = static_cast<std::uint64_t>(step);
  if (grid_.world_rank() == exp_.debug.kill_rank && step == exp_.debug.kill_at_step) std::raise(SIGKILL);
  if (plant_divergence(exp_, grid_, log_, step)) emit(step, 0, "planted", step, 0, 0, 1);  // testing
  if (auto hit = faults_.evaluate("rank.stall", at)) {
    emit(step, 0, "stall", static_cast<std::int64_t>(hit->param("duration_ms")), 0, 0, 0);
    flush();
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(hit->param("duration_ms")));
  }
  if (auto hit = faults_.evaluate("device.page.corrupt", at)) {
    auto cached = dc_.cached_pages();
    std::erase_if(cached, [this](PageId q) { return !pool_.owns(q); });  // sharded: only this rank's pages
    if (!cached.empty()) {
      const PageId victim = cached[corrupt_rng_.below(cached.size())];
      for (int b = 0; b < static_cast<int>(hit->param("bits")); ++b) pool_.corrupt(victim, corrupt_rng_);
      emit(step, 0, "corrupt", victim.value(), 0, 0, 0);
    }
  }
}

}  // namespace kvgrid
