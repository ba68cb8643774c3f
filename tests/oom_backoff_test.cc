// Note [oom back-off] with real ranks: BATCHDIST_FAULT_OOM makes the last rank
// throw c10::OutOfMemoryError halfway through a step's backward; every rank must
// redo that step split as m/2 x 2a, and end with the weights of a run that used
// m/2 x 2a from that step on.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "mpi_helpers.h"
#include "worker/common/console.h"
#include "worker/train/trainer.h"

using namespace batchdist;
using namespace batchdist::worker;

namespace {

constexpr int64_t kSteps = 12;

Config oomConfig(bool bn, bool overlap, int64_t recover_after = 0, bool sync_bn = false,
                 const std::string& shard = "none") {
  const int P = mpitest::worldSize();
  return parseConfig(
      "model: {name: mlp, hidden: [32, 16], batchnorm: " + std::string(bn ? "true" : "false") +
          ", sync_batchnorm: " + (sync_bn ? "true" : "false") + "}\n"
          "data: {name: synthetic, samples: 600, shape: [12], classes: 5, val_fraction: 0.1}\n"
          "batch: {global: " + std::to_string(8 * P) + ", per_gpu: 8}\n"
          "optim: {name: sgd, lr: 0.1, base_batch: 64, momentum: 0.9, weight_decay: 0.001}\n"
          "train: {seed: 5, epochs: 1, max_steps: " + std::to_string(kSteps) +
          ", oom_recover_after_steps: " + std::to_string(recover_after) + "}\n"
          // 1 KB buckets: one layer each, so buckets leave during backward, before the failure.
          "dist: {bucket_mb: 0.001, overlap: " + (overlap ? "true" : "false") + ", shard: " +
          shard + "}\n",
      "oom.yaml");
}

/// Rank 0's parameters and buffers, flattened.
torch::Tensor stateOf(Model& m) {
  std::vector<torch::Tensor> flat;
  for (const auto& x : m.state()) flat.push_back(x.detach().to(torch::kDouble).reshape({-1}));
  return torch::cat(flat);
}

struct Run {
  torch::Tensor state;  ///< rank 0's
  TrainResult result;   ///< rank 0's
  Plan plan;            ///< the split training ended with
};

/// Trainer::train() on every rank with the fault plan of BATCHDIST_FAULT_OOM =
/// `faults` (Note [fault plan]; the process's environment untouched).
Run trainWithFaults(const Config& cfg, const std::string& faults,
                    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const auto plan_of_faults = faultPlanFromEnvironment([&faults](const char* name) {
    return std::string(name) == "BATCHDIST_FAULT_OOM" ? faults.c_str() : nullptr;
  });
  Run run;
  mpitest::inGroup(mpitest::worldSize(), [&](collective::Communicator& comm) {
    const auto data = loadData(cfg.data, cfg.train.seed, "");
    const auto plan = makePlan(cfg, comm.size(), data.train.size(), cfg.model.batchnorm);
    Trainer trainer(cfg, comm, data, at::kCPU, plan, &plan_of_faults);
    Console quiet(false, ProgressStyle::kOff);
    const auto result = trainer.train(quiet);
    run = {stateOf(trainer.model()), result, trainer.plan()};  // this rank's (tests read rank 0's)
  }, "gloo", timeout);
  return run;
}

/// The reference: per-GPU batch 8 for steps [0, at), then `per_gpu` from step
/// `at` on, with no failure; evaluated at the end as train() ends its epoch.
torch::Tensor trainSwitching(const Config& cfg, int64_t at, int64_t per_gpu) {
  torch::Tensor out;
  mpitest::inGroup(mpitest::worldSize(), [&](collective::Communicator& comm) {
    const auto data = loadData(cfg.data, cfg.train.seed, "");
    const auto plan = makePlan(cfg, comm.size(), data.train.size(), cfg.model.batchnorm);
    StepEngine trainer(cfg, comm, data, at::kCPU, plan);
    Sharder sharder(plan, static_cast<uint64_t>(cfg.train.seed));
    trainer.loader().start(trainer.jobs(sharder, 0, at), 0);
    for (int64_t s = 0; s < at; ++s) trainer.trainStep(sharder.realSamples(s), plan.lrAt(s));
    const auto split = withPerGpu(plan, per_gpu);
    trainer.setPlan(split);
    Sharder after(split, static_cast<uint64_t>(cfg.train.seed));
    trainer.loader().start(trainer.jobs(after, at, kSteps - at), 0, at * split.accum);
    for (int64_t s = at; s < kSteps; ++s) trainer.trainStep(after.realSamples(s), split.lrAt(s));
    trainer.evaluate();
    if (comm.rank() == 0) out = stateOf(trainer.model());
  });
  return out;
}

std::string last() { return std::to_string(mpitest::worldSize() - 1); }

}  // namespace

// The last rank fails step 5 (halfway through backward: buckets already left);
// every rank redoes it as 4 x 2 and the weights are bitwise those of a run that
// switched to 4 x 2 at step 5, with and without the overlapped reducer.
TEST(OomBackoff, InjectedFailureRedoesTheStepAsHalfTheBatchTwiceAccumulated) {
  for (bool overlap : {true, false}) {
    const auto cfg = oomConfig(/*bn=*/true, overlap);
    const auto run = trainWithFaults(cfg, last() + ":5");
    const auto ref = trainSwitching(cfg, 4, 4);
    if (mpitest::worldRank() != 0) continue;
    SCOPED_TRACE(overlap ? "dist.overlap: true" : "dist.overlap: false");
    EXPECT_TRUE(run.result.completed);
    EXPECT_EQ(run.result.steps, kSteps);
    ASSERT_EQ(run.result.oom_backoffs.size(), 1u);
    const auto& b = run.result.oom_backoffs[0];
    EXPECT_EQ(b.step, 5);
    EXPECT_EQ(b.ranks, std::vector<int64_t>{mpitest::worldSize() - 1});
    EXPECT_EQ(b.from_per_gpu, 8);
    EXPECT_EQ(b.from_accum, 1);
    EXPECT_EQ(b.to_per_gpu, 4);
    EXPECT_EQ(b.to_accum, 2);
    EXPECT_EQ(run.plan.per_gpu, 4);
    EXPECT_EQ(run.plan.accum, 2);
    EXPECT_EQ(run.plan.global, 8 * mpitest::worldSize());
    const double diff = (run.state - ref).abs().max().item<double>();
    std::printf("[ oom ] W=%d overlap=%d BatchNorm: back-off at step 5 vs 4x2 from step 5: "
                "max |diff| = %.3g\n", mpitest::worldSize(), overlap, diff);
    EXPECT_EQ(diff, 0.0);
  }
}

// Note [sharded optimizer]: the back-off drops the failed step's gradients before
// any optimizer sees them, so under dist.shard: optimizer it is the unsharded
// back-off, step for step: the same split afterwards and the same weights.
TEST(OomBackoff, UnderShardedOptimizerStateTheBackOffIsTheUnshardedOne) {
  const auto sharded = trainWithFaults(
      oomConfig(/*bn=*/true, /*overlap=*/true, 0, false, "optimizer"), last() + ":5");
  const auto plain = trainWithFaults(oomConfig(/*bn=*/true, /*overlap=*/true), last() + ":5");
  if (mpitest::worldRank() != 0) return;
  ASSERT_EQ(sharded.result.oom_backoffs.size(), 1u);
  EXPECT_EQ(sharded.result.oom_backoffs[0].step, 5);
  EXPECT_EQ(sharded.plan.per_gpu, 4);
  EXPECT_EQ(sharded.plan.accum, 2);
  EXPECT_TRUE(sharded.result.completed);
  const double diff = (sharded.state - plain.state).abs().max().item<double>();
  std::printf("[ oom ] W=%d dist.shard: optimizer vs none, back-off at step 5: max |diff| = %.3g\n",
              mpitest::worldSize(), diff);
  EXPECT_LE(diff, 1e-6 * plain.state.abs().max().item<double>());
}

// Note [sharded gradients]: under dist.shard: gradients the failing rank still
// makes every reduce-scatter of the step (at step 9 the window has two
// micro-batches, the first already reduce-scattered), every rank drops the step,
// and the run goes on as the unsharded back-off does: 8 x 1, 4 x 2 from step 5,
// 2 x 4 from step 9. Without BatchNorm (whose batches of 2 would magnify it) the
// only difference is the order of the sums under accumulation: to rounding.
TEST(OomBackoff, UnderShardedGradientsTheBackOffIsTheUnshardedOne) {
  const std::string faults = last() + ":5," + last() + ":9";
  const auto sharded = trainWithFaults(
      oomConfig(/*bn=*/false, /*overlap=*/true, 0, false, "gradients"), faults);
  const auto plain = trainWithFaults(oomConfig(/*bn=*/false, /*overlap=*/true), faults);
  if (mpitest::worldRank() != 0) return;
  ASSERT_EQ(sharded.result.oom_backoffs.size(), 2u);
  EXPECT_EQ(sharded.result.oom_backoffs[1].step, 9);
  EXPECT_EQ(sharded.plan.per_gpu, 2);
  EXPECT_EQ(sharded.plan.accum, 4);
  EXPECT_TRUE(sharded.result.completed);
  const double diff = (sharded.state - plain.state).abs().max().item<double>();
  std::printf("[ oom ] W=%d dist.shard: gradients vs none, back-offs at steps 5 and 9: max |diff| = %.3g\n",
              mpitest::worldSize(), diff);
  EXPECT_LE(diff, 1e-5 * plain.state.abs().max().item<double>());
}

// Without BatchNorm the split does not matter (Note [loss normalisation]): the
// run that backed off matches the run that never failed to float rounding.
TEST(OomBackoff, WithoutBatchNormTheResultIsTheUnsplitRunsToRounding) {
  const auto cfg = oomConfig(/*bn=*/false, /*overlap=*/true);
  const auto run = trainWithFaults(cfg, last() + ":5");
  const auto plain = trainWithFaults(cfg, "");
  if (mpitest::worldRank() != 0) return;
  ASSERT_EQ(run.result.oom_backoffs.size(), 1u);
  EXPECT_TRUE(plain.result.oom_backoffs.empty());
  const double diff = (run.state - plain.state).abs().max().item<double>();
  std::printf("[ oom ] W=%d no BatchNorm: 8x1 then 4x2 from step 5 vs 8x1 throughout: "
              "max |diff| = %.3g\n", mpitest::worldSize(), diff);
  EXPECT_LT(diff, 1e-6);
}

TEST(OomBackoff, TwoRanksFailingTheSameStepBackOffOnce) {
  const auto run = trainWithFaults(oomConfig(true, true), "0:5," + last() + ":5");
  if (mpitest::worldRank() != 0) return;
  EXPECT_TRUE(run.result.completed);
  ASSERT_EQ(run.result.oom_backoffs.size(), 1u);
  const std::vector<int64_t> both{0, mpitest::worldSize() - 1};
  EXPECT_EQ(run.result.oom_backoffs[0].ranks, both);
  EXPECT_EQ(run.plan.per_gpu, 4);
}

// Twice in the same step (the redo fails too), and once more in a later step.
TEST(OomBackoff, ARankFailingAgainBacksOffAgain) {
  const auto same = trainWithFaults(oomConfig(true, true), last() + ":5:2");
  const auto later = trainWithFaults(oomConfig(true, false), last() + ":3," + last() + ":9");
  if (mpitest::worldRank() != 0) return;
  EXPECT_TRUE(same.result.completed);
  ASSERT_EQ(same.result.oom_backoffs.size(), 2u);
  EXPECT_EQ(same.result.oom_backoffs[1].step, 5);
  EXPECT_EQ(same.result.oom_backoffs[1].from_per_gpu, 4);
  EXPECT_EQ(same.result.oom_backoffs[1].to_per_gpu, 2);
  EXPECT_EQ(same.result.oom_backoffs[1].to_accum, 4);
  EXPECT_EQ(same.plan.per_gpu, 2);
  EXPECT_TRUE(later.result.completed);
  ASSERT_EQ(later.result.oom_backoffs.size(), 2u);
  EXPECT_EQ(later.result.oom_backoffs[0].step, 3);
  EXPECT_EQ(later.result.oom_backoffs[1].step, 9);
  EXPECT_EQ(later.plan.per_gpu, 2);
  EXPECT_EQ(later.result.steps, kSteps);
}

// 8 -> 4 -> 2, and 2 is BatchNorm's minimum: every rank stops after step 4.
TEST(OomBackoff, AtTheBatchNormMinimumEveryRankStopsWithTheReason) {
  const auto run = trainWithFaults(oomConfig(true, true), last() + ":5:10");
  if (mpitest::worldRank() != 0) return;
  EXPECT_FALSE(run.result.completed);
  EXPECT_EQ(run.result.steps, 4);
  ASSERT_EQ(run.result.oom_backoffs.size(), 3u);
  EXPECT_EQ(run.result.oom_backoffs[2].from_per_gpu, 2);
  EXPECT_EQ(run.result.oom_backoffs[2].to_per_gpu, 0);
  const auto& why = run.result.failure;
  EXPECT_NE(why.find("out of memory at step 5 on rank " + last() + " with per-GPU batch 2 x "
                     "accumulation 4"), std::string::npos) << why;
  EXPECT_NE(why.find("BatchNorm"), std::string::npos) << why;
  EXPECT_NE(why.find("stopped after step 4"), std::string::npos) << why;
}

// train.oom_recover_after_steps: 3 good steps at 4 x 2, then 8 x 1 again; a
// retry that fails backs off again and doubles the wait.
TEST(OomBackoff, TheLargerBatchIsTriedAgainAfterGoodSteps) {
  const auto ok = trainWithFaults(oomConfig(true, true, 3), last() + ":5");
  const auto again = trainWithFaults(oomConfig(true, true, 3), last() + ":5," + last() + ":8");
  if (mpitest::worldRank() != 0) return;
  EXPECT_EQ(ok.result.oom_retries, 1);
  EXPECT_EQ(ok.plan.per_gpu, 8);
  ASSERT_EQ(again.result.oom_backoffs.size(), 2u);
  EXPECT_TRUE(again.result.oom_backoffs[1].retry);
  EXPECT_EQ(again.result.oom_backoffs[1].step, 8);
  EXPECT_EQ(again.result.oom_retries, 1);  // the next retry waits 6 steps: past step 12
  EXPECT_EQ(again.plan.per_gpu, 4);
  EXPECT_TRUE(again.result.completed);
}

// Note [sync batchnorm failure]: with synchronised BatchNorm the last rank runs
// out of memory halfway through step 5's forward, before the second BatchNorm
// allreduce the others are waiting in. Every rank learns of it at the end of
// that forward and backs off with the others (each rank's own report says so),
// and the run ends with the weights of one that switched to 4 x 2 at step 5.
// Collectives time out after 20 s. Before the fix the failing rank's gradient
// buckets met the others' BatchNorm allreduce out of step: Gloo aborted the
// job on the size mismatch (the MPI backend too; equal sizes would have waited
// until the timeout).
TEST(OomBackoff, WithSyncBatchNormAFailureInForwardBacksOffEveryRankTogether) {
  for (bool overlap : {true, false}) {
    const auto cfg = oomConfig(/*bn=*/true, overlap, /*recover_after=*/0, /*sync_bn=*/true);
    const auto run = trainWithFaults(cfg, last() + ":5:1:forward", std::chrono::seconds(20));
    const auto ref = trainSwitching(cfg, 4, 4);
    SCOPED_TRACE(overlap ? "dist.overlap: true" : "dist.overlap: false");
    EXPECT_TRUE(run.result.completed) << "rank " << mpitest::worldRank();
    EXPECT_EQ(run.result.steps, kSteps);
    ASSERT_EQ(run.result.oom_backoffs.size(), 1u) << "rank " << mpitest::worldRank();
    EXPECT_EQ(run.result.oom_backoffs[0].step, 5);
    EXPECT_EQ(run.result.oom_backoffs[0].ranks, std::vector<int64_t>{mpitest::worldSize() - 1});
    EXPECT_EQ(run.plan.per_gpu, 4);
    EXPECT_EQ(run.plan.accum, 2);
    if (mpitest::worldRank() != 0) continue;
    const double diff = (run.state - ref).abs().max().item<double>();
    std::printf("[ oom ] W=%d overlap=%d sync BatchNorm, failure in forward: back-off at step 5 "
                "vs 4x2 from step 5: max |diff| = %.3g\n", mpitest::worldSize(), overlap, diff);
    EXPECT_EQ(diff, 0.0);
  }
}

// Failing again in the redo's forward (a non-final micro-batch of 4 x 2 has no
// injection; the final one does): two back-offs, 8 -> 4 -> 2, every rank.
TEST(OomBackoff, WithSyncBatchNormFailingForwardTwiceBacksOffTwice) {
  const auto cfg = oomConfig(/*bn=*/true, /*overlap=*/true, 0, /*sync_bn=*/true);
  const auto run = trainWithFaults(cfg, last() + ":5:2:forward", std::chrono::seconds(20));
  EXPECT_TRUE(run.result.completed);
  ASSERT_EQ(run.result.oom_backoffs.size(), 2u) << "rank " << mpitest::worldRank();
  EXPECT_EQ(run.result.oom_backoffs[1].from_per_gpu, 4);
  EXPECT_EQ(run.plan.per_gpu, 2);
}
