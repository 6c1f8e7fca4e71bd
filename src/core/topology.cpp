#include "core/topology.hpp"

#include "core/check.hpp"

namespace kvgrid {

std::string GridShape::str() const {
  return "TP" + std::to_string(tp) + "xCP" + std::to_string(cp) + "xPP" + std::to_string(pp);
}

int TopologySpec::world_size() const {
  int n = 0;
  for (const auto& g : groups) n += g.shape.size();
  return n;
}

std::string TopologySpec::str() const {
  if (groups.size() == 1) return groups[0].shape.str();
  std::string s;
  for (std::size_t i = 0; i < groups.size(); ++i)
    s += (i ? " + " : "") + groups[i].name + " " + groups[i].shape.str();
  return s;
}

int layout_rank(const TopologySpec& spec, int group, int pp, int cp, int tp) {
  KVGRID_CHECK(group >= 0 && group < static_cast<int>(spec.groups.size()), "group ", group);
  int base = 0;
  for (int g = 0; g < group; ++g) base += spec.groups[static_cast<std::size_t>(g)].shape.size();
  const auto& s = spec.groups[static_cast<std::size_t>(group)].shape;
  KVGRID_CHECK(pp >= 0 && pp < s.pp && cp >= 0 && cp < s.cp && tp >= 0 && tp < s.tp,
               "coordinate pp=", pp, " cp=", cp, " tp=", tp, " outside ", s.str());
  return base + (pp * s.cp + cp) * s.tp + tp;
}

GridCoord layout_coord(const TopologySpec& spec, int world_rank) {
  KVGRID_CHECK(world_rank >= 0 && world_rank < spec.world_size(), "world rank ", world_rank);
  int base = 0;
  for (std::size_t g = 0; g < spec.groups.size(); ++g) {
    const auto& s = spec.groups[g].shape;
    if (world_rank < base + s.size()) {
      int local = world_rank - base;
      GridCoord c;
      c.group = static_cast<int>(g);
      c.group_base = base;
      c.tp = local % s.tp;
      c.cp = (local / s.tp) % s.cp;
      c.pp = local / (s.tp * s.cp);
      return c;
    }
    base += s.size();
  }
  KVGRID_CHECK(false, "unreachable");
  return {};
}

RankGrid::RankGrid(const TopologySpec& spec, MPI_Comm world) : spec_(spec) {
  KVGRID_MPI_CHECK(MPI_Comm_rank(world, &world_rank_));
  KVGRID_MPI_CHECK(MPI_Comm_size(world, &world_size_));
  if (world_size_ != spec_.world_size()) {
    throw InputError("the topology " + spec_.str() + " needs " + std::to_string(spec_.world_size()) +
                     " ranks but the job has " + std::to_string(world_size_) + " (mpirun -np " +
                     std::to_string(spec_.world_size()) + ")");
  }
  coord_ = layout_coord(spec_, world_rank_);
  const auto& s = shape();
  // Colours are unique across groups: group_base + an index below the group's size.
  const int b = coord_.group_base;
  KVGRID_MPI_CHECK(MPI_Comm_dup(world, &world_));
  KVGRID_MPI_CHECK(MPI_Comm_split(world, coord_.group, world_rank_, &group_));
  KVGRID_MPI_CHECK(MPI_Comm_split(world, b + coord_.pp * s.cp + coord_.cp, coord_.tp, &tp_));
  KVGRID_MPI_CHECK(MPI_Comm_split(world, b + coord_.pp * s.tp + coord_.tp, coord_.cp, &cp_));
  KVGRID_MPI_CHECK(MPI_Comm_split(world, b + coord_.pp, coord_.cp * s.tp + coord_.tp, &stage_));
  KVGRID_MPI_CHECK(MPI_Comm_split(world, b + coord_.cp * s.tp + coord_.tp, coord_.pp, &pp_));
}

RankGrid::~RankGrid() {
  for (MPI_Comm* c : {&tp_, &cp_, &stage_, &pp_, &group_, &world_})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

}  // namespace kvgrid
