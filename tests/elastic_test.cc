// Note [elastic split]: the world an elastic job goes on at, and why.
#include <gtest/gtest.h>

#include "common/error.h"
#include "worker/plan/elastic.h"

using namespace batchdist::worker;

namespace {

ElasticSlots slots(int64_t global, int64_t slots, int64_t max_fit) {
  ElasticSlots s;
  s.global = global;
  s.slots = slots;
  s.max_fit = max_fit;
  return s;
}

}  // namespace

TEST(ElasticSplit, TheLargestWorldWithAnEqualSplitWinsAndTheOthersAreSaid) {
  const auto s = elasticSplit(slots(96, 7, 32));  // 7 and 5 do not divide 96
  EXPECT_EQ(s.world, 6);
  EXPECT_EQ(s.per_gpu, 16);
  EXPECT_EQ(s.accum, 1);
  ASSERT_EQ(s.passed_over.size(), 1u);
  EXPECT_EQ(s.passed_over[0], "7 ranks: G=96 is not divisible by 7");
  EXPECT_EQ(s.why, "G=96 = 16 per GPU x 1 accumulation x 6 ranks, the largest world of 7 or fewer "
                   "with an equal split");
}

TEST(ElasticSplit, AccumulationTakesWhatNoLongerFits) {
  // 8 ranks ran 256 as 32 x 1; 4 survive: 64 a rank, 32 known to fit -> 32 x 2.
  const auto s = elasticSplit(slots(256, 4, 32));
  EXPECT_EQ(s.world, 4);
  EXPECT_EQ(s.per_gpu, 32);
  EXPECT_EQ(s.accum, 2);
  EXPECT_TRUE(s.passed_over.empty());
  EXPECT_EQ(s.why, "G=256 = 32 per GPU x 2 accumulation x 4 ranks");
  // The largest divisor that fits, not a power of two: 60 a rank, 25 fits -> 20 x 3.
  const auto t = elasticSplit(slots(120, 2, 25));
  EXPECT_EQ(t.per_gpu, 20);
  EXPECT_EQ(t.accum, 3);
}

TEST(ElasticSplit, TheBatchNormMinimumAndTheFitRuleWorldsOut) {
  auto in = slots(42, 6, 4);  // 6 ranks: 7 a rank: divisors 1, 7
  in.min_per_gpu = 2;
  const auto s = elasticSplit(in);
  EXPECT_EQ(s.world, 3);  // 14 a rank: 2 x 7
  EXPECT_EQ(s.per_gpu, 2);
  EXPECT_EQ(s.accum, 7);
  ASSERT_EQ(s.passed_over.size(), 3u);
  EXPECT_EQ(s.passed_over[0], "6 ranks: 7 samples a rank have no divisor from 2 to 4 (the largest "
                              "per-GPU batch known to fit)");
  EXPECT_EQ(s.passed_over[1], "5 ranks: G=42 is not divisible by 5");
  EXPECT_EQ(s.passed_over[2], "4 ranks: G=42 is not divisible by 4");
}

TEST(ElasticSplit, TheCapTheMinimumAndNoSplitAtAll) {
  auto capped = slots(64, 16, 64);
  capped.max_ranks = 4;
  EXPECT_EQ(elasticSplit(capped).world, 4);

  auto few = slots(64, 1, 64);
  few.min_ranks = 2;
  const auto f = elasticSplit(few);
  EXPECT_EQ(f.world, 0);
  EXPECT_EQ(f.why, "1 rank(s) available, fewer than the minimum of 2");

  auto prime = slots(13, 4, 4);  // 13 is prime: only W=1 divides, and 13 > 4 fits
  prime.min_per_gpu = 2;
  const auto p = elasticSplit(prime);
  EXPECT_EQ(p.world, 0);
  EXPECT_EQ(p.passed_over.size(), 4u);
  EXPECT_EQ(p.why, "no world from 4 down to 1 ranks has an equal split of G=13 into per-GPU "
                   "batches from 2 to 4");
}

TEST(ElasticSplit, InputsThatAreNoJobsAreRefused) {
  EXPECT_THROW(elasticSplit(slots(0, 4, 8)), batchdist::Error);
  EXPECT_THROW(elasticSplit(slots(64, 4, 0)), batchdist::Error);
  auto bn = slots(64, 4, 1);
  bn.min_per_gpu = 2;
  EXPECT_THROW(elasticSplit(bn), batchdist::Error);
}
