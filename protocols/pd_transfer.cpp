#include "protocols/pd_transfer.hpp"

#include "core/check.hpp"

namespace kvgrid::protocols {

bool pd_decode_reuse(const std::string& variant) {
  if (variant == "decode_reuse") return true;
  KVGRID_CHECK(variant == "full_transfer", "unknown protocol.pd variant '", variant, "'");
  return false;
}

}  // namespace kvgrid::protocols
