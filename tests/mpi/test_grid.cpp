// Rank grid: communicators match the layout arithmetic at every world size.
#include <gtest/gtest.h>

#include <vector>

#include "core/check.hpp"
#include "core/topology.hpp"
#include "mpi_util.hpp"

namespace kvgrid {
namespace {

std::vector<int> members(MPI_Comm c) {
  int n = 0, me = testing::world_rank();
  MPI_Comm_size(c, &n);
  std::vector<int> out(static_cast<std::size_t>(n));
  MPI_Allgather(&me, 1, MPI_INT, out.data(), 1, MPI_INT, c);
  return out;
}

void check_grid(const TopologySpec& spec) {
  RankGrid g(spec, MPI_COMM_WORLD);
  const auto c = g.coord();
  const auto& s = g.shape();
  EXPECT_EQ(layout_coord(spec, g.world_rank()), c);
  std::vector<int> tp, cp, stage, pp, group;
  for (int t = 0; t < s.tp; ++t) tp.push_back(layout_rank(spec, c.group, c.pp, c.cp, t));
  for (int k = 0; k < s.cp; ++k) cp.push_back(layout_rank(spec, c.group, c.pp, k, c.tp));
  for (int k = 0; k < s.cp; ++k)
    for (int t = 0; t < s.tp; ++t) stage.push_back(layout_rank(spec, c.group, c.pp, k, t));
  for (int p = 0; p < s.pp; ++p) pp.push_back(layout_rank(spec, c.group, p, c.cp, c.tp));
  for (int r = 0; r < s.size(); ++r) group.push_back(c.group_base + r);
  EXPECT_EQ(members(g.tp()), tp);
  EXPECT_EQ(members(g.cp()), cp);
  EXPECT_EQ(members(g.stage()), stage);
  EXPECT_EQ(members(g.pp()), pp);
  EXPECT_EQ(members(g.group()), group);
  EXPECT_EQ(members(g.world()).size(), static_cast<std::size_t>(testing::world_size()));
  EXPECT_EQ(g.pp_prev(), c.pp == 0 ? MPI_PROC_NULL : c.pp - 1);
  EXPECT_EQ(g.pp_next(), c.pp == s.pp - 1 ? MPI_PROC_NULL : c.pp + 1);
  int pp_rank = -1;
  MPI_Comm_rank(g.pp(), &pp_rank);
  EXPECT_EQ(pp_rank, c.pp);
}

TEST(RankGrid, SingleGroupCommunicatorsMatchLayout) {
  const int n = testing::world_size();
  check_grid(TopologySpec{{{"main", testing::shape_for(n)}}});
  check_grid(TopologySpec{{{"main", GridShape{1, 1, n}}}});  // pure pipeline
  check_grid(TopologySpec{{{"main", GridShape{1, n, 1}}}});  // pure CP
}

TEST(RankGrid, TwoGroupWorld) {
  const int n = testing::world_size();
  if (n < 2) GTEST_SKIP() << "a prefill + decode world needs at least 2 ranks";
  const int half = n / 2;
  check_grid(TopologySpec{{{"prefill", testing::shape_for(n - half)}, {"decode", GridShape{1, 1, half}}}});
}

TEST(RankGrid, WrongWorldSizeIsAnInputErrorNamingBothNumbers) {
  const int n = testing::world_size();
  TopologySpec spec{{{"main", GridShape{1, 1, n + 1}}}};
  try {
    RankGrid g(spec, MPI_COMM_WORLD);
    FAIL() << "no error for a wrong world size";
  } catch (const InputError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("needs " + std::to_string(n + 1) + " ranks"), std::string::npos) << m;
    EXPECT_NE(m.find("has " + std::to_string(n)), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace kvgrid
