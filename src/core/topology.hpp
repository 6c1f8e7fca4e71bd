// Rank grids (DESIGN §2 "Ranks and grids").
//
// A world holds one group (`[topology]`) or two (`[topology.prefill]` then `[topology.decode]`).
// Inside a group ranks are ordered TP fastest, then CP, then PP:
//     world_rank = group_base + (pp * CP + cp) * TP + tp
// `layout_*` functions are the pure arithmetic; `RankGrid` builds the communicators once with
// MPI_Comm_split and frees them on destruction:
//     tp    — same group, pp, cp          (TP peers: all-reduce partial checksums, MIN of counts)
//     cp    — same group, pp, tp          (CP peers)
//     stage — same group, pp              (all TP·CP ranks of one pipeline stage)
//     pp    — same group, cp, tp          (one rank per stage; pp_prev / pp_next are neighbours)
//     group — all ranks of the group
//     world — duplicate of the world communicator
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace kvgrid {

struct GridShape {
  int tp = 1, cp = 1, pp = 1;
  int size() const { return tp * cp * pp; }
  std::string str() const;  // "TP2xCP2xPP2"
};

struct TopologySpec {
  struct Group {
    std::string name;  // "main", or "prefill" / "decode"
    GridShape shape;
  };
  std::vector<Group> groups;
  int world_size() const;
  std::string str() const;  // "TP2xCP2xPP2" or "prefill TP1xCP1xPP2 + decode TP1xCP1xPP2"
};

struct GridCoord {
  int group = 0;
  int tp = 0, cp = 0, pp = 0;
  int group_base = 0;  // world rank of the group's first rank
  bool operator==(const GridCoord&) const = default;
};

// Pure layout arithmetic (no MPI). Throws InternalError for out-of-range arguments.
int layout_rank(const TopologySpec& spec, int group, int pp, int cp, int tp);
GridCoord layout_coord(const TopologySpec& spec, int world_rank);

class RankGrid {
 public:
  // Collective over `world`. Throws InputError (on every rank, same text) when the world size
  // does not match the topology.
  RankGrid(const TopologySpec& spec, MPI_Comm world);
  ~RankGrid();
  RankGrid(const RankGrid&) = delete;
  RankGrid& operator=(const RankGrid&) = delete;

  const TopologySpec& spec() const { return spec_; }
  const GridCoord& coord() const { return coord_; }
  const GridShape& shape() const { return spec_.groups[static_cast<std::size_t>(coord_.group)].shape; }
  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  bool is_first_stage() const { return coord_.pp == 0; }
  bool is_last_stage() const { return coord_.pp == shape().pp - 1; }
  bool is_stage_leader() const { return coord_.tp == 0 && coord_.cp == 0; }

  MPI_Comm tp() const { return tp_; }
  MPI_Comm cp() const { return cp_; }
  MPI_Comm stage() const { return stage_; }
  MPI_Comm pp() const { return pp_; }
  MPI_Comm group() const { return group_; }
  MPI_Comm world() const { return world_; }
  // Ranks in pp(); MPI_PROC_NULL at the ends of the pipeline.
  int pp_prev() const { return coord_.pp > 0 ? coord_.pp - 1 : MPI_PROC_NULL; }
  int pp_next() const { return coord_.pp + 1 < shape().pp ? coord_.pp + 1 : MPI_PROC_NULL; }

 private:
  TopologySpec spec_;
  GridCoord coord_;
  int world_rank_ = 0, world_size_ = 0;
  MPI_Comm tp_ = MPI_COMM_NULL, cp_ = MPI_COMM_NULL, stage_ = MPI_COMM_NULL, pp_ = MPI_COMM_NULL,
           group_ = MPI_COMM_NULL, world_ = MPI_COMM_NULL;
};

}  // namespace kvgrid
