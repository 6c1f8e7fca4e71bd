#include <gtest/gtest.h>

#include "cache/device_pool.hpp"
#include "core/check.hpp"

namespace kvgrid::cache {
namespace {

TEST(DevicePool, AllocationIsAllOrNothingAndNeverHandsOutThePaddingPage) {
  DevicePool pool(Pages(4));
  auto a = pool.alloc(Pages(3));
  ASSERT_TRUE(a);
  EXPECT_EQ(*a, (std::vector<PageId>{PageId(1), PageId(2), PageId(3)}));
  EXPECT_FALSE(pool.alloc(Pages(2)).has_value());
  EXPECT_EQ(pool.free_pages(), Pages(1));  // the failed request took nothing
  EXPECT_FALSE(pool.is_allocated(PageId(0)));
  pool.free(*a);
  EXPECT_EQ(pool.free_pages(), Pages(4));
  pool.verify();
}

TEST(DevicePool, SameCallsGiveSameIds) {
  DevicePool x(Pages(8)), y(Pages(8));
  auto a = x.alloc(Pages(3)), b = y.alloc(Pages(3));
  x.free(std::vector<PageId>{(*a)[1]});
  y.free(std::vector<PageId>{(*b)[1]});
  EXPECT_EQ(*x.alloc(Pages(2)), *y.alloc(Pages(2)));
}

TEST(DevicePool, DoubleFreeAndForeignPagesAreBugs) {
  DevicePool pool(Pages(2));
  auto a = pool.alloc(Pages(1));
  pool.free(*a);
  EXPECT_THROW(pool.free(*a), InternalError);
  EXPECT_THROW(pool.free(std::vector<PageId>{PageId(0)}), InternalError);
  EXPECT_THROW(pool.free(std::vector<PageId>{PageId(3)}), InternalError);
}

}  // namespace
}  // namespace kvgrid::cache
