// Agreement with real ranks under mpirun: each rank has its own out-of-memory
// threshold; every rank must pick the same batch, one that fits everywhere, and
// training must then start on all ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "mpi_helpers.h"
#include "simulated_measurer.h"
#include "worker/common/console.h"
#include "worker/search/output.h"
#include "worker/search/search.h"
#include "worker/train/step/step_measurer.h"
#include "worker/train/trainer.h"

using namespace batchdist;
using namespace batchdist::worker;

TEST(SearchAgreement, TheTightestRankBoundsTheChoiceAndTrainingStarts) {
  const int P = mpitest::worldSize();
  const int rank = mpitest::worldRank();
  // Rank 1 fails above 63 (i.e. at 64); every other rank fits 128.
  testsupport::SimulatedMeasurer measurer(rank == 1 ? 63 : 128, 1000.0 * (rank + 1), 4);
  auto cfg = parseConfig(
      "model: {name: mlp, hidden: [16], batchnorm: true}\n"
      "data: {name: synthetic, samples: 4000, shape: [8], classes: 3}\n"
      "batch: {per_gpu: auto}\n"
      "search: {min: 8, objective: max_fit, multiple_of: 32}\n"
      "train: {epochs: 1, max_steps: 3}\n",
      "agreement.yaml");
  mpitest::inGroup(P, [&](collective::Communicator& comm) {
    const auto data = loadData(cfg.data, cfg.train.seed, "");
    BatchSearch search(cfg, comm, measurer, data.train.size(), true);
    const auto res = search.run(nullptr);
    // Doubling 8, 16, 32 (ok), 64 (fails on rank 1); multiple_of 32 leaves nothing between.
    EXPECT_EQ(res.chosen, 32);
    const auto chosen = comm.allgather(static_cast<double>(res.chosen));
    for (double c : chosen) EXPECT_EQ(c, res.chosen);
    ASSERT_EQ(res.candidates.size(), 4u);
    EXPECT_TRUE(res.candidates.back().failed);
    EXPECT_NE(res.candidates.back().reason.find("out of memory on rank 1"), std::string::npos);
    // Slowest rank (rank 0, 1000 samples/s at saturation) sets the pace.
    EXPECT_NEAR(res.candidates[0].global_sps, P * 1000.0 * 8 / 12, 1e-6);
    // Training starts on every rank with the agreed plan.
    const auto plan = makePlan(cfg, comm.size(), data.train.size(), true, res.chosen);
    EXPECT_EQ(plan.per_gpu, 32);
    EXPECT_EQ(plan.global, 32 * P);
    Trainer trainer(cfg, comm, data, at::kCPU, plan);
    Console quiet(false, ProgressStyle::kOff);
    const auto result = trainer.train(quiet);
    EXPECT_EQ(result.steps, 3);
  });
}

TEST(SearchAgreement, RealMeasurerOverBudgetOnOneRankDoesNotHang) {
  // The real training-step measurer with a CPU memory budget only on the last
  // rank: candidates above it fail there while the others keep stepping through
  // the gradient allreduce, and all ranks agree.
  const int P = mpitest::worldSize();
  const int rank = mpitest::worldRank();
  auto cfg = parseConfig(
      "model: {name: cnn, channels: [16], batchnorm: false}\n"
      "data: {name: synthetic, samples: 2100, shape: [3, 32, 32], classes: 10, val_fraction: 0}\n"
      // Memory decides here, not the data (8 steps an epoch would stop at 2100 / 8 / P).
      "batch: {per_gpu: auto, adapt_min_steps: 1}\n"
      "search: {min: 32, max: 512, objective: max_fit, warmup_steps: 1, timed_steps: 1,\n"
      "         min_time_s: 0, max_time_s: 0.3}\n",
      "real.yaml");
  mpitest::inGroup(P, [&](collective::Communicator& comm) {
    const auto data = loadData(cfg.data, cfg.train.seed, "");
    // Calibrate: this process's peak at the smallest and largest candidate.
    double small = 0;
    double large = 0;
    {
      auto probe = makeTrainStepMeasurer(cfg, comm, data, at::kCPU);
      TimingRule once;  // one timed step: only the peak matters here
      once.min_steps = 1;
      once.min_time_s = 0;
      once.max_time_s = 0;
      small = probe->measure(32, 1, Levers{}, once).peak_mb;
      large = probe->measure(512, 1, Levers{}, once).peak_mb;
    }
    // (EXPECT, not ASSERT: a rank leaving early would strand the others' collectives.)
    EXPECT_GT(large, small + 50) << "activations should dominate the peak";
    Config mine = cfg;
    if (rank == P - 1) mine.search.memory_limit_mb = static_cast<int64_t>((small + large) / 2);
    auto measurer = makeTrainStepMeasurer(mine, comm, data, at::kCPU);
    BatchSearch search(mine, comm, *measurer, data.train.size(), false);
    const auto res = search.run(nullptr);
    const auto chosen = comm.allgather(static_cast<double>(res.chosen));
    for (double c : chosen) EXPECT_EQ(c, res.chosen);
    EXPECT_GE(res.chosen, 32);
    EXPECT_LT(res.chosen, 512);
    bool failed_on_last = false;
    for (const auto& c : res.candidates) {
      if (c.failed) {
        failed_on_last |= c.reason.find("over memory budget on rank " + std::to_string(P - 1)) !=
                          std::string::npos;
      }
    }
    EXPECT_TRUE(failed_on_last);
    if (comm.rank() == 0) std::printf("%s", searchTable(res).c_str());
  });
}

TEST(SearchAgreement, RanksStopEveryCandidateAtTheSameStep) {
  // Note [adaptive timing]: rank 1 wants every candidate timed for 0.3 s, rank 0
  // would stop at once; both time the same steps, as many as rank 1 needs.
  const int P = mpitest::worldSize();
  auto cfg = parseConfig(
      "model: {name: mlp, hidden: [32], batchnorm: false}\n"
      "data: {name: synthetic, samples: 2000, shape: [16], classes: 4, val_fraction: 0}\n"
      "batch: {per_gpu: auto}\n"
      "search: {min: 8, max: 32, warmup_steps: 1, timed_steps: 5, min_time_s: 0,\n"
      "         max_time_s: 0, rounds: 1}\n",
      "agree.yaml");
  mpitest::inGroup(P, [&](collective::Communicator& comm) {
    Config mine = cfg;
    if (comm.rank() == 1) {
      mine.search.min_time_s = 0.3;
      mine.search.max_time_s = 0.5;
    }
    const auto data = loadData(mine.data, mine.train.seed, "");
    auto measurer = makeTrainStepMeasurer(mine, comm, data, at::kCPU);
    BatchSearch search(mine, comm, *measurer, data.train.size(), false);
    const auto res = search.run(nullptr);
    for (const auto& c : res.candidates) {
      const auto steps = comm.allgather(static_cast<double>(c.timed_steps));
      for (double s : steps) EXPECT_EQ(s, steps[0]) << "per-GPU " << c.per_gpu;
      if (comm.rank() == 0 && P > 1) {
        double secs = 0;
        for (double t : c.step_seconds) secs += t;
        EXPECT_GE(secs, 0.25) << "per-GPU " << c.per_gpu << ": rank 0 stopped before rank 1";
        EXPECT_EQ(static_cast<int64_t>(c.step_seconds.size()), c.timed_steps);
      }
    }
  });
}

TEST(LeverSwitch, OneMeasurerRunsEachCombinationAsOneBuiltUnderIt) {
  // Note [lever switch]: the measurer switches levers on one trainer (recompute a
  // flag of the model, sharding a new update strategy). Each combination, reached
  // by switching, there and back, steps without failure and holds what a measurer
  // built under it holds: the parameters, gradients and optimizer state by part,
  // the state split over the ranks under dist.shard (Note [memory by part]).
  const int P = mpitest::worldSize();
  const auto cfg = parseConfig(
      "model: {name: mlp, hidden: [64, 64], batchnorm: false, dropout: 0.1, recompute: auto}\n"
      "data: {name: synthetic, samples: 512, shape: [32], classes: 4, val_fraction: 0}\n"
      "optim: {name: adamw}\n"
      "batch: {per_gpu: auto}\n"
      "dist: {shard: auto}\n",
      "switch.yaml");
  TimingRule once;
  once.min_steps = 1;
  once.min_time_s = 0;
  once.max_time_s = 0;
  const std::vector<Levers> walk{{Shard::kNone, Recompute::kOff},
                                 {Shard::kGradients, Recompute::kOn},
                                 {Shard::kOptimizer, Recompute::kOff},
                                 {Shard::kOptimizer, Recompute::kOn},
                                 {Shard::kNone, Recompute::kOff}};
  mpitest::inGroup(P, [&](collective::Communicator& comm) {
    const auto data = loadData(cfg.data, cfg.train.seed, "");
    auto switching = makeTrainStepMeasurer(cfg, comm, data, at::kCPU);
    MemoryParts plain;
    for (const auto& levers : walk) {
      SCOPED_TRACE(leversText(levers));
      const auto a = switching->measure(16, 2, levers, once);
      const Config fixed = withLevers(cfg, levers);
      const auto b = makeTrainStepMeasurer(fixed, comm, data, at::kCPU)->measure(16, 2, levers, once);
      // (EXPECT, not ASSERT: a rank leaving early would strand the others' collectives.)
      EXPECT_EQ(a.fail, FailKind::kNone) << a.detail;
      EXPECT_EQ(a.timed_steps, 1);
      EXPECT_EQ(a.parts.parameters_mb, b.parts.parameters_mb);
      EXPECT_EQ(a.parts.gradients_mb, b.parts.gradients_mb);
      EXPECT_EQ(a.parts.optimizer_state_mb, b.parts.optimizer_state_mb);
      if (levers.shard == Shard::kNone) plain = a.parts;
    }
    ASSERT_GT(plain.optimizer_state_mb, 0);
    // Sharded, the state is a rank's share (plus padding to a multiple of P).
    const auto sharded = switching->measure(16, 2, {Shard::kGradients, Recompute::kOff}, once);
    EXPECT_LT(sharded.parts.optimizer_state_mb, plain.optimizer_state_mb / P * 1.05);
    EXPECT_LT(sharded.parts.gradients_mb, plain.gradients_mb / P * 1.05);
  });
}

TEST(SearchAgreement, AnOverBudgetCandidateIsNotTimed) {
  // Note [search warm-up]: a rank past its budget after the untimed step says so,
  // and no rank times the candidate; without warm-up steps, the first check point
  // (2 timed steps) stops it.
  const int P = mpitest::worldSize();
  auto cfg = parseConfig(
      "model: {name: mlp, hidden: [32], batchnorm: false}\n"
      "data: {name: synthetic, samples: 512, shape: [16], classes: 4, val_fraction: 0}\n"
      "batch: {per_gpu: auto}\n",
      "budget.yaml");
  TimingRule slow;  // wants at least 6 steps and a second
  slow.min_steps = 6;
  slow.min_time_s = 1;
  slow.max_time_s = 10;
  mpitest::inGroup(P, [&](collective::Communicator& comm) {
    const auto data = loadData(cfg.data, cfg.train.seed, "");
    Config mine = cfg;
    if (comm.rank() == P - 1) mine.search.memory_limit_mb = 1;  // any process is over 1 MB
    auto measurer = makeTrainStepMeasurer(mine, comm, data, at::kCPU);
    const auto m = measurer->measure(16, 1, Levers{}, slow);
    EXPECT_EQ(m.step_seconds.size(), 0u);
    EXPECT_EQ(m.fail, comm.rank() == P - 1 ? FailKind::kOverBudget : FailKind::kNone);
    EXPECT_GT(m.peak_mb, 1);
    Config cold = mine;
    cold.search.warmup_steps = 0;
    const auto c = makeTrainStepMeasurer(cold, comm, data, at::kCPU)->measure(16, 1, Levers{}, slow);
    EXPECT_EQ(c.step_seconds.size(), 2u);
    EXPECT_EQ(c.fail, comm.rank() == P - 1 ? FailKind::kOverBudget : FailKind::kNone);
    // Without a budget the same rule times its 6 steps at least.
    auto free = makeTrainStepMeasurer(cfg, comm, data, at::kCPU);
    EXPECT_GE(free->measure(16, 1, Levers{}, slow).step_seconds.size(), 6u);
  });
}
