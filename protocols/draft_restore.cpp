#include "protocols/draft_restore.hpp"

#include "core/check.hpp"

namespace kvgrid::protocols {

const std::vector<std::string>& draft_modes() {
  static const std::vector<std::string> m{"none", "packed", "sidecar", "target_only"};
  return m;
}

std::optional<cache::DraftLayout> draft_layout(const std::string& variant) {
  if (variant == "none") return std::nullopt;
  if (variant == "packed") return cache::DraftLayout::Packed;
  if (variant == "sidecar") return cache::DraftLayout::Sidecar;
  KVGRID_CHECK(variant == "target_only", "unknown model.draft.mode '", variant, "'");
  return cache::DraftLayout::TargetOnly;
}

}  // namespace kvgrid::protocols
