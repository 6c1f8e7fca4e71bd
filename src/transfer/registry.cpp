// Transfer backends by name.
#include "core/check.hpp"
#include "transfer/transfer_engine.hpp"

namespace kvgrid::transfer {

std::unique_ptr<TransferEngine> make_simulated_engine(const EngineConfig& cfg);
std::unique_ptr<TransferEngine> make_threaded_engine(const EngineConfig& cfg);

std::unique_ptr<TransferEngine> make_engine(const EngineConfig& cfg) {
  if (cfg.backend == "simulated") return make_simulated_engine(cfg);
  if (cfg.backend == "threaded") return make_threaded_engine(cfg);
  throw InputError("unknown transfer engine '" + cfg.backend + "' (simulated, threaded; cuda needs -DKVGRID_CUDA=ON)");
}

}  // namespace kvgrid::transfer
