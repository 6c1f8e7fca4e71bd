// An event whose wait goes through core/wait: synchronize() polls query() with the wait's back-off,
// its watchdog and its progress hooks, instead of blocking wherever the event's own synchronize()
// would (a CUDA event synchronize, which no watchdog sees and during which no hook runs). The GPU
// backends' events are handed to the cache stack this way (registry.cpp, nccl_data.cpp): a copy or
// an NCCL operation that never completes ends in a watchdog report naming `what`, not a silent hang.
#pragma once

#include <string>

#include "transfer/transfer_engine.hpp"

namespace kvgrid::transfer {

// `inner`'s bytes, modelled times and failure carry over (failure also when known only at completion).
Event polled(Event inner, std::string what);

}  // namespace kvgrid::transfer
