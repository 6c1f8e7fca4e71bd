// The step message's wire format: every field declared in visit_fields survives pack/unpack
// exactly, inline (small) and with a payload (large); a corrupt size is refused.
#include <gtest/gtest.h>

#include "core/check.hpp"
#include "runtime/step_message.hpp"

namespace kvgrid {
namespace {

StepMessage sample(std::size_t entries) {
  StepMessage m;
  m.clock_ns = 0x123456789abcdefULL;
  m.exhausted = 1;
  m.total = 4096;
  m.write_acks = 7;
  m.pd_stop = 1;
  for (std::size_t i = 0; i < entries; ++i) m.entries.push_back({i + 1, 16 * i, 16 * i + 9, ~0ULL - i});
  m.specs = {5, 6, 7};
  m.aborts = {42, 1ULL << 40};
  m.stops = {{3, 2}};
  m.admits = {1, 0, 1};
  m.accepts = {{9, 4}};
  m.pd = {{1, 2, 3}, {4, 5, ~6ULL}};
  return m;
}

void expect_same(const StepMessage& a, const StepMessage& b) {
  EXPECT_EQ(a.clock_ns, b.clock_ns);
  EXPECT_EQ(a.exhausted, b.exhausted);
  EXPECT_EQ(a.total, b.total);
  EXPECT_EQ(a.write_acks, b.write_acks);
  EXPECT_EQ(a.pd_stop, b.pd_stop);
  ASSERT_EQ(a.entries.size(), b.entries.size());
  for (std::size_t i = 0; i < a.entries.size(); ++i) {
    EXPECT_EQ(a.entries[i].id, b.entries[i].id);
    EXPECT_EQ(a.entries[i].start, b.entries[i].start);
    EXPECT_EQ(a.entries[i].end, b.entries[i].end);
    EXPECT_EQ(a.entries[i].value, b.entries[i].value);
  }
  EXPECT_EQ(a.specs, b.specs);
  EXPECT_EQ(a.aborts, b.aborts);
  EXPECT_EQ(a.stops, b.stops);
  EXPECT_EQ(a.admits, b.admits);
  EXPECT_EQ(a.accepts, b.accepts);
  EXPECT_EQ(a.pd, b.pd);
}

TEST(StepMessage, EveryFieldSurvivesInlineAndWithAPayload) {
  const StepMessage empty;
  const Packed pe = pack(empty);
  EXPECT_TRUE(pe.inline_payload());
  expect_same(unpack(pe), empty);
  const StepMessage small = sample(0);
  const Packed ps = pack(small);
  EXPECT_TRUE(ps.inline_payload()) << "a decode step's message should be one header";
  expect_same(unpack(ps), small);
  const StepMessage big = sample(50);
  const Packed pb = pack(big);
  EXPECT_FALSE(pb.inline_payload());
  EXPECT_EQ(pb.payload.size(), 50u * 8 + 3 + 2 * 2 + 4 + 3 + 4 + 2 * 6);
  expect_same(unpack(pb), big);
}

TEST(StepMessage, ACorruptSizeIsRefused) {
  Packed p = pack(sample(50));
  p.payload.pop_back();
  EXPECT_THROW(unpack(p), InternalError);
}

}  // namespace
}  // namespace kvgrid
