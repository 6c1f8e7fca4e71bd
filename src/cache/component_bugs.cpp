#include "cache/component_bugs.hpp"

#include <array>

#include "core/check.hpp"

namespace kvgrid::cache {

namespace {
constexpr std::array<ComponentBugInfo, 11> kBugs{{
    {ComponentBug::SwaRunAcrossTombstones, "swa_run_across_tombstones", 14,
     "the SWA validator resets its live run at the first tombstone only and counts later tombstones as live"},
    {ComponentBug::HealFreesStale, "heal_frees_stale", 15,
     "a tombstone keeps the SWA slots it held when the insert left it; healing it frees them again"},
    {ComponentBug::UnfinishedInsertLive, "unfinished_insert_live", 16,
     "a chunk's insert offers SWA from its shared prefix with the page ids it released, and the tree keeps the offer live"},
    {ComponentBug::FlooredFrontier, "floored_frontier", 17,
     "the SWA insert window is floor(W/p) pages: with page > window an insert keeps no SWA page at its end"},
    {ComponentBug::SwaVetoFullLeaf, "swa_veto_full_leaf", 18,
     "SWA refuses a new leaf shorter than its window, and FULL's pages for it are dropped with it"},
    {ComponentBug::SwaLoadWholeNode, "swa_load_whole_node", 19,
     "a load-back does not cut a host-only SWA node straddling the window's start: it restores the whole node"},
    {ComponentBug::SplitTruncatesState, "split_truncates_state", 20,
     "a split hands the node's MAMBA state to the new prefix node, as if a point state could be truncated"},
    {ComponentBug::StateAtFloor, "state_at_floor", 21,
     "after a forward that passed no checkpoint depth, the running state is saved as the checkpoint of the floored depth"},
    {ComponentBug::MtpStateAtFloor, "mtp_state_at_floor", 21,
     "a decode step that accepted several draft tokens and passed a checkpoint depth registers its final state there"},
    {ComponentBug::SharedStateSlot, "shared_state_slot", 22,
     "a request reusing a MAMBA state advances the tree's slot in place instead of a private copy"},
    {ComponentBug::ReadPastBoundary, "read_past_boundary", 23,
     "a request reuses FULL's pages to the deepest boundary FULL accepts, past the one SWA and MAMBA accept"},
}};
}  // namespace

std::span<const ComponentBugInfo> component_bug_list() { return kBugs; }

std::optional<ComponentBug> parse_component_bug(std::string_view name) {
  for (const auto& b : kBugs)
    if (b.name == name) return b.bug;
  return std::nullopt;
}

std::vector<std::string> component_bug_names() {
  std::vector<std::string> out;
  for (const auto& b : kBugs) out.emplace_back(b.name);
  return out;
}

ComponentBugs ComponentBugs::parse(std::span<const std::string> names) {
  ComponentBugs bugs;
  for (const auto& n : names) {
    const auto b = parse_component_bug(n);
    KVGRID_CHECK(b.has_value(), "unknown component bug '", n, "'");
    bugs.add(*b);
  }
  return bugs;
}

}  // namespace kvgrid::cache
