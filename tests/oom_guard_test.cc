// Note [oom back-off]: the decisions of OomGuard, one rank and several.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/thread_ranks.h"
#include "worker/config/config.h"
#include "worker/plan/plan.h"
#include "worker/train/oom_guard.h"

using namespace batchdist;
using namespace batchdist::worker;

namespace {

Config smallConfig(int64_t recover_after) {
  return parseConfig("model: {name: mlp, hidden: [8]}\n"
                     "data: {name: synthetic, samples: 256, shape: [4], classes: 2}\n"
                     "batch: {global: 64, per_gpu: 16}\n"
                     "train: {oom_recover_after_steps: " + std::to_string(recover_after) + "}\n",
                     "oom.yaml");
}

Plan split(const Config& cfg, int64_t per_gpu) { return makePlan(cfg, 1, 256, false, per_gpu); }

}  // namespace

TEST(OomGuard, BacksOffToTheLargestProperDivisorAndStopsAtTheFloor) {
  const auto cfg = smallConfig(0);
  testsupport::runRanks(1, [&](collective::Communicator& c) {
    OomGuard guard(c, at::kCPU, cfg, nullptr);
    auto b = guard.backOff(split(cfg, 16), {{0}, 900, 1000}, /*min_per_gpu=*/2, /*global_step=*/4);
    EXPECT_EQ(b.step, 5);
    EXPECT_EQ(b.from_per_gpu, 16);
    EXPECT_EQ(b.from_accum, 4);
    EXPECT_EQ(b.to_per_gpu, 8);
    EXPECT_EQ(b.to_accum, 8);  // G = m a W unchanged
    EXPECT_EQ(guard.state().larger, (std::vector<int64_t>{16}));
    b = guard.backOff(split(cfg, 2), {{0}, 900, 1000}, 2, 9);
    EXPECT_EQ(b.to_per_gpu, 0) << "below the BatchNorm floor nothing is left";
    EXPECT_EQ(guard.state().larger, (std::vector<int64_t>{16})) << "a failure marks nothing";
    EXPECT_NE(oomFailure(b, false, 2).find("needs at least 2 samples per micro-batch"),
              std::string::npos);
    EXPECT_NE(oomFailure(b, false, 2).find("every rank stopped after step 9"), std::string::npos);
  });
}

TEST(OomGuard, RetriesTheLargerBatchAfterGoodStepsAndWaitsTwiceAsLongWhenItFailsAgain) {
  const auto cfg = smallConfig(3);
  testsupport::runRanks(1, [&](collective::Communicator& c) {
    OomGuard guard(c, at::kCPU, cfg, nullptr);
    guard.backOff(split(cfg, 16), {{0}, 0, 0}, 1, 0);
    guard.splitChanged();
    for (int i = 0; i < 2; ++i) guard.goodStep();
    EXPECT_EQ(guard.recoverTo(split(cfg, 8)), 0) << "2 good steps of 3";
    guard.goodStep();
    EXPECT_EQ(guard.recoverTo(split(cfg, 8)), 16);
    EXPECT_TRUE(guard.state().retrying);
    EXPECT_TRUE(guard.state().larger.empty());
    const auto b = guard.backOff(split(cfg, 16), {{0}, 0, 0}, 1, 7);
    EXPECT_TRUE(b.retry);
    EXPECT_EQ(guard.state().recover_after, 6);
    EXPECT_FALSE(guard.state().retrying);
  });
}

TEST(OomGuard, AnAdaptiveSplitKeepsOnlyTheBatchesAboveItMarked) {
  const auto cfg = smallConfig(0);
  testsupport::runRanks(1, [&](collective::Communicator& c) {
    OomGuard guard(c, at::kCPU, cfg, nullptr);
    guard.restore({{32, 8, 16}, 0, 0, true});
    guard.adaptiveSplit(8);
    EXPECT_EQ(guard.state().larger, (std::vector<int64_t>{32, 16}));
    EXPECT_FALSE(guard.state().retrying);
  });
}

TEST(OomGuard, InjectedTriesAreThisRanksAndUsedOnce) {
  const auto cfg = smallConfig(0);
  FaultPlan faults;
  faults.oom = {{0, 3, 2, false}, {1, 3, 1, false}, {0, 5, 1, true}};
  testsupport::runRanks(2, [&](collective::Communicator& c) {
    OomGuard guard(c, at::kCPU, cfg, &faults);
    std::vector<int> fired;
    for (int64_t step = 0; step < 6; ++step) {
      for (int t = 0; t < 3; ++t) {
        guard.armFault(step);
        if (guard.injectInBackward()) fired.push_back(static_cast<int>(10 * (step + 1) + 1));
        if (guard.injectInForward()) fired.push_back(static_cast<int>(10 * (step + 1) + 2));
        guard.disarm();
      }
    }
    if (c.rank() == 0) {
      EXPECT_EQ(fired, (std::vector<int>{31, 31, 52}));
    } else {
      EXPECT_EQ(fired, (std::vector<int>{31}));
    }
    // Which ranks failed, and the highest peak among them: one allreduce.
    const auto f = guard.agreeFigures(c.rank() == 1);
    EXPECT_EQ(f.ranks, (std::vector<int64_t>{1}));
  });
}
