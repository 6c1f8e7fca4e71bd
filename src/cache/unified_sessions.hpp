// The session types of the unified tree (unified_tree.hpp "Sessions"; the tracker itself is in
// unified_tree_sessions.cpp): marks on nodes, the policy with its planted bugs, registration
// outcomes and the counters the report shows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/ids.hpp"

namespace kvgrid::cache::unified {

using SessionId = std::uint64_t;  // 0: no session

// A session's claim on a node for one component: the region of one of its frontiers starts at
// depth `from` (a node on the frontier's path is covered iff it ends deeper than `from`);
// `count` frontiers of the session claim it so.
struct SessionMark {
  SessionId session = 0;
  Tokens from{0};
  std::int32_t count = 0;
};

struct SessionPolicy {
  bool order = false;              // cache.eviction = session: references order eviction
  std::size_t tombstones = 8192;   // closed session ids remembered (late finishers register nothing)
  // Planted bugs (bug-catalogue #24, #25): closing a session stamps its nodes as just used (its
  // cold KV looks hot); finishers register whatever their generation or their session's state.
  bool close_resets_recency = false;
  bool no_generation = false;
};

enum class SessionRegistration : std::uint8_t { Registered, NoSession, Stale, Closed, Root };
const char* registration_name(SessionRegistration r);

struct SessionStats {
  std::int64_t opened = 0, closed = 0;
  std::int64_t registered = 0, stale_finishes = 0, closed_finishes = 0;
  // Recency inversions: tokens of unreferenced device values eviction took although a closed
  // session's idle node, used less recently, was a candidate too (0 unless closing resets recency:
  // a closed session's cold KV outliving KV used after it).
  std::int64_t recency_inversion_tokens = 0;
  // Values of referenced (session_ref > 0) nodes that eviction took, by ComponentId: slots, and
  // tokens (paged: pages × page size; point: the node's length). Device and host separately.
  std::vector<std::int64_t> forced_slots, forced_tokens, forced_host_slots, forced_host_tokens;
};

// Distinct sessions among `marks` (sorted by session, then from): a component's session_ref.
inline std::int64_t distinct_sessions(std::span<const SessionMark> marks) {
  std::int64_t n = 0;
  for (std::size_t i = 0; i < marks.size(); ++i)
    if (i == 0 || marks[i].session != marks[i - 1].session) ++n;
  return n;
}

}  // namespace kvgrid::cache::unified
