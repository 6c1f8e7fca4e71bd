// The component bug record as buggy variants (`cache.component_bugs`).
//
// Each entry plants one production bug of the unified radix cache's components
// (../shared/reference/bug-catalogue.md #14–#23; #21 twice: a forward that passed no checkpoint, and
// a speculative-decoding step that verified several tokens past one) in the code whose mechanism it reproduces — the
// SWA validator, the SWA insert rule, the MAMBA split, the hybrid cache's request path — never
// as an assertion added for the purpose. What catches each (the oracle, `verify()`, a
// post-condition the correct code keeps, a shape mismatch) and in how many seeds is measured by
// `jobs/component_bugs.py` and tabled in docs/hybrid.md. The default set is empty: correct code.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvgrid::cache {

enum class ComponentBug : std::uint8_t {
  SwaRunAcrossTombstones,  // #14 the SWA validator resets its live run at the first tombstone only
  HealFreesStale,          // #15 healing a tombstone frees the stale slots it held before
  UnfinishedInsertLive,    // #16 a chunk's insert offers its released SWA pages as live
  FlooredFrontier,         // #17 the SWA insert window is floored to pages (empty when page > window)
  SwaVetoFullLeaf,         // #18 SWA refuses a leaf shorter than its window, FULL's pages with it
  SplitTruncatesState,     // #20 a split hands a MAMBA state to the prefix, as if it could be truncated
  StateAtFloor,            // #21 the running state is attached at the floored checkpoint depth
  SharedStateSlot,         // #22 a request advances the tree's state slot in place (no private copy)
  ReadPastBoundary,        // #23 FULL's pages are read past the boundary every component accepts
  SwaLoadWholeNode,        // #19 a load-back restores a host-only SWA node straddling the window whole
  MtpStateAtFloor,         // #21 a multi-token decode step's final state is registered at the floored checkpoint
};

struct ComponentBugInfo {
  ComponentBug bug;
  std::string_view name;  // the value in cache.component_bugs
  int catalogue;          // bug-catalogue number
  std::string_view what;  // one line: the planted mechanism
};

std::span<const ComponentBugInfo> component_bug_list();
std::optional<ComponentBug> parse_component_bug(std::string_view name);
std::vector<std::string> component_bug_names();

// A set of planted bugs (empty: the correct code).
class ComponentBugs {
 public:
  ComponentBugs() = default;
  // Names from cache.component_bugs (InternalError for an unknown one: the schema checked them).
  static ComponentBugs parse(std::span<const std::string> names);
  void add(ComponentBug b) { bits_ |= 1U << static_cast<unsigned>(b); }
  bool has(ComponentBug b) const { return (bits_ >> static_cast<unsigned>(b)) & 1U; }
  bool empty() const { return bits_ == 0; }

 private:
  std::uint32_t bits_ = 0;
};

}  // namespace kvgrid::cache
