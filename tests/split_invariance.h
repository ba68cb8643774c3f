#pragma once
// Note [loss normalisation] under test with real ranks: one global batch G split as
// (W=1, a=P), ..., (W=P, a=1) over the ranks of an mpirun job of P trains the same
// weights. Shared by the mpi tests that check it for a model and task each.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "mpi_helpers.h"
#include "worker/data/data.h"
#include "worker/train/step/step_engine.h"

namespace batchdist::testsupport {

/// How a test loads its data for a config (its own context, e.g. module targets).
using LoadData = std::function<worker::DataSplit(const worker::Config&)>;

inline worker::DataSplit loadPlainData(const worker::Config& cfg) {
  return worker::loadData(cfg.data, cfg.train.seed, "");
}

/// Trains `steps` optimizer steps on the ranks of `comm`; returns the flattened
/// parameters (identical on every rank of the group). `check`, if given, sees the
/// trainer first.
inline torch::Tensor trainSteps(const worker::Config& cfg, collective::Communicator& comm,
                                int64_t steps, const LoadData& load = loadPlainData,
                                const std::function<void(worker::StepEngine&)>& check = {}) {
  using namespace batchdist::worker;
  const auto data = load(cfg);
  const auto plan = makePlan(cfg, comm.size(), data.train.size(), modelHasBatchNorm(cfg.model));
  StepEngine trainer(cfg, comm, data, at::kCPU, plan);
  if (check) check(trainer);
  Sharder sharder(plan, static_cast<uint64_t>(cfg.train.seed));
  int64_t global = 0;
  for (int64_t epoch = 0; global < steps; ++epoch) {
    sharder.setEpoch(epoch);
    const int64_t n = std::min(plan.steps_per_epoch, steps - global);
    trainer.loader().start(trainer.jobs(sharder, 0, n), epoch);
    for (int64_t s = 0; s < n; ++s, ++global) {
      trainer.trainStep(sharder.realSamples(s), plan.lrAt(global));
    }
  }
  trainer.checkHealth(0);
  const worker::WholeParameters whole(trainer.model());  // Note [parameter units]
  std::vector<torch::Tensor> flat;
  for (const auto& p : trainer.model().parameters()) flat.push_back(p.detach().reshape({-1}));
  return torch::cat(flat);
}

/// Rank 0's parameters after `steps` steps of `cfg` for every split of its
/// global batch over W ranks, W dividing the world size P (a = P / W micro-batches
/// each); an empty map on the other ranks. `load` and `check` as trainSteps'.
inline std::map<int, torch::Tensor> weightsForEverySplit(
    const worker::Config& cfg, int64_t steps, const std::string& backend = "gloo",
    const LoadData& load = loadPlainData,
    const std::function<void(worker::StepEngine&)>& check = {}) {
  const int P = mpitest::worldSize();
  std::map<int, torch::Tensor> weights;  // world size -> rank 0's parameters
  for (int W = 1; W <= P; ++W) {
    if (P % W != 0) continue;
    mpitest::inGroup(W, [&](collective::Communicator& comm) {
      auto w = trainSteps(cfg, comm, steps, load, check);
      if (comm.rank() == 0) weights[W] = w;
    }, backend);
  }
  return weights;
}

/// On rank 0: every split's weights are within `tolerance` of W=1's (max |dw|),
/// each difference printed under `label`.
inline void expectSameAsOneRank(const std::map<int, torch::Tensor>& weights, double tolerance,
                                const std::string& label, int64_t G) {
  if (mpitest::worldRank() != 0) return;
  const int P = mpitest::worldSize();
  ASSERT_GE(weights.size(), 2u);
  const auto& ref = weights.at(1);
  for (const auto& [W, w] : weights) {
    const double diff = (w - ref).abs().max().item<double>();
    EXPECT_LT(diff, tolerance) << label << " W=" << W << " a=" << P / W << " vs W=1 a=" << P
                               << ": max |dw| " << diff;
    std::printf("[ invariance ] %s W=%d a=%d G=%lld: max |w - w(W=1)| = %.3g\n", label.c_str(), W,
                P / W, static_cast<long long>(G), diff);
  }
}

}  // namespace batchdist::testsupport
