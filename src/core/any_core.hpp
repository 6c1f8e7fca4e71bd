// A helper thread's placement: mpirun binds a rank to one core (its default for two ranks or
// fewer), and a thread inherits the binding. A helper thread is meant for a core the rank does not
// use, so it lets itself run on any core the machine has (the kernel keeps it within what the
// process's cgroup allows; where that is refused it stays where the rank runs).
#pragma once

#include <sched.h>
#include <unistd.h>

namespace kvgrid {

inline void allow_any_core() {
  cpu_set_t any;
  CPU_ZERO(&any);
  const long cpus = sysconf(_SC_NPROCESSORS_CONF);
  for (long c = 0; c < cpus && c < CPU_SETSIZE; ++c) CPU_SET(static_cast<int>(c), &any);
  (void)sched_setaffinity(0, sizeof any, &any);
}

}  // namespace kvgrid
