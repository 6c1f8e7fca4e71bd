// protocol.pd_restore — P/D decode's host→device restores are read only once their outcome is
// agreed.
//
// Invariant: decode decodes a request only on KV every decode rank holds intact (the received
// suffix and the restored prefix), and no other request reads a restore before that. A decode
// request reads its restored pages steps after the copies started (once its suffix arrived), so
// publishing them at once — safe in one group, where the loading request reads them in the same
// step — would hand them to every request admitted meanwhile.
//
//   agreed     (correct) the restore stays private to its request (the nodes host-only, the pages
//              its own: DeviceCache::set_private_restores) until the outcome — MIN over every
//              decode rank of "none of my copies failed" — is known: at PP = 1 one MIN over the
//              stage at the step the suffix arrived; at PP > 1 pipelined over every stage, started
//              at the end of that step and read with the next step's records (no stage waits for
//              another inside a step). Intact: published (confirm_restore) and decoded. Broken on
//              any rank: the request fails everywhere (reason pd_restore), never decoded, its
//              pages freed, the prefix left host-only.
//   unchecked  (buggy) published at once, the outcome never looked at: other requests may read
//              pages before their copy landed, and a broken restore is decoded on — oracle
//              mismatches (the TensorRT-LLM #8813 / Dynamo #15079 class).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/agree.hpp"
#include "core/ids.hpp"
#include "core/topology.hpp"

namespace kvgrid::protocols {

enum class PdRestore { Agreed, Unchecked };
PdRestore parse_pd_restore(const std::string& name);  // "agreed" | "unchecked"
// Whether decode's restores stay private until agreed (DeviceCache::set_private_restores).
inline bool private_restores(PdRestore v) { return v == PdRestore::Agreed; }

// The agreed variant's outcome agreement (also protocol.load_back's, over a group's ranks). Every
// rank of the group makes the same calls in the same order: add() for each request whose suffix arrived (in the records' order), decided() before
// and after a step's records, end_of_step() after the step's message went out.
class RestoreAgreement {
 public:
  struct Outcome {
    RequestId id;
    std::uint64_t ready_ns;  // the request's KV is complete (receives and restores), modelled
    bool ok;
  };
  explicit RestoreAgreement(const RankGrid& grid);
  ~RestoreAgreement();
  RestoreAgreement(const RestoreAgreement&) = delete;
  RestoreAgreement& operator=(const RestoreAgreement&) = delete;

  // A request whose suffix arrived at this step; `local_ok`: none of this rank's copies failed.
  void add(RequestId id, std::uint64_t ready_ns, bool local_ok);
  // The outcomes decided now: PP = 1 this step's (one MIN over the stage), PP > 1 the previous
  // step's (the pipelined MIN over the decode group finishes here).
  std::vector<Outcome> decided();
  // End of the step (PP > 1): this step's agreement starts.
  void end_of_step();
  std::size_t pending() const { return adding_.size() + agreeing_.size(); }

 private:
  bool pipelined_;
  DupComm stage_, group_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::vector<Outcome> adding_, agreeing_;
  std::vector<std::uint64_t> agreeing_ok_;  // in flight while req_ is
};

}  // namespace kvgrid::protocols
