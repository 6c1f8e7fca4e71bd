#include "protocols/component_boundary.hpp"

#include "core/check.hpp"

namespace kvgrid::protocols {

const std::vector<std::string>& component_boundary_variants() {
  static const std::vector<std::string> v{"whole_model", "local_components"};
  return v;
}

bool stage_keeps_component(const std::string& variant, bool in_model, bool local) {
  if (variant == "whole_model") return in_model;
  if (variant == "local_components") return in_model && local;
  KVGRID_CHECK(false, "protocol.component_boundary = \"", variant, "\" is not a variant");
  return false;
}

}  // namespace kvgrid::protocols
