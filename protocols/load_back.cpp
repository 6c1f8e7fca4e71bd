#include "protocols/load_back.hpp"

#include "core/check.hpp"

namespace kvgrid::protocols {

LoadBack parse_load_back(const std::string& name) {
  if (name == "agreed") return LoadBack::Agreed;
  KVGRID_CHECK(name == "unchecked", "unknown protocol.load_back variant '", name, "'");
  return LoadBack::Unchecked;
}

}  // namespace kvgrid::protocols
