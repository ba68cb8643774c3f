// The gradient noise scale (Note [gradient noise scale], Note [gradient norms])
// where the answer is known: linear and logistic regression on synthetic data,
// whose per-sample gradients, their mean G and covariance S are computed exactly
// here, so B_simple = tr(S) / |G|^2 is known. Ranks are threads over Gloo; the
// gradients go through the real Reducer / GradientSynchronizer, normalised as the
// trainer does (Note [loss normalisation]: loss sum over the rank's samples / R).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "collective/grad_sync.h"
#include "collective/reducer.h"
#include "tests/thread_ranks.h"
#include "worker/train/step/noise_scale.h"
#include "worker/train/step/step_engine.h"

using namespace batchdist;
using namespace batchdist::collective;
using batchdist::worker::NoiseScaleEstimator;

namespace {

enum class Regression { kLinear, kLogistic };

/// A finite population: every step draws each rank's batch from it with
/// replacement, so per-sample gradients are i.i.d. with exactly mean G and
/// covariance S (population moments, 1/N).
struct Population {
  torch::Tensor x, y;       // N x d, N
  torch::Tensor w0, b0;     // the point where the noise scale is measured
  double b_simple = 0;      // exact tr(S) / |G|^2 there
};

torch::Tensor lossSum(Regression task, const torch::Tensor& w, const torch::Tensor& b,
                      const torch::Tensor& x, const torch::Tensor& y) {
  auto z = torch::mv(x, w) + b;
  if (task == Regression::kLinear) return 0.5 * (z - y).pow(2).sum();
  return torch::nn::functional::binary_cross_entropy_with_logits(
      z, y, torch::nn::functional::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kSum));
}

Population makePopulation(Regression task, int64_t n, int64_t d) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(7);
  Population p;
  p.x = at::randn({n, d}, gen, torch::kDouble);
  auto w_true = at::randn({d}, gen, torch::kDouble);
  auto z = torch::mv(p.x, w_true);
  if (task == Regression::kLinear) {
    p.y = z + 0.5 * at::randn({n}, gen, torch::kDouble);
    p.w0 = w_true + 0.25 * at::randn({d}, gen, torch::kDouble);
  } else {
    p.y = (at::rand({n}, gen, torch::kDouble) < torch::sigmoid(z)).to(torch::kDouble);
    p.w0 = 0.6 * w_true;
  }
  p.b0 = torch::full({1}, 0.1, torch::kDouble);
  // Exact per-sample gradients (closed form): residual r_i times (x_i, 1).
  auto zi = torch::mv(p.x, p.w0) + p.b0;
  auto r = task == Regression::kLinear ? zi - p.y : torch::sigmoid(zi) - p.y;
  auto grads = torch::cat({p.x * r.unsqueeze(1), r.unsqueeze(1)}, 1);  // N x (d + 1)
  auto mean = grads.mean(0);
  const double trace = (grads - mean).pow(2).sum(1).mean().item<double>();
  p.b_simple = trace / mean.pow(2).sum().item<double>();
  p.x = p.x.to(torch::kFloat);
  p.y = p.y.to(torch::kFloat);
  return p;
}

struct Outcome {
  double window = 0;   // plain means over every step
  double smoothed = 0; // EMA
  double max_norm_error = 0;  // measured norms vs a direct computation (relative)
};

/// `steps` steps of `world` ranks with per-rank batch `b`; gradients summed by the
/// reducer (overlap) or the copy path; `scale`: an fp16-style loss scale.
Outcome estimate(Regression task, const Population& pop, int world, int64_t b, int64_t steps,
                 bool overlap, double scale) {
  Outcome out;
  std::mutex mu;
  testsupport::runRanks(world, [&](Communicator& c) {
    auto w = pop.w0.to(torch::kFloat).clone().requires_grad_(true);
    auto bias = pop.b0.to(torch::kFloat).clone().requires_grad_(true);
    std::vector<at::Tensor> params{w, bias};
    // Tiny buckets: one parameter each, so the local norm is summed over buckets
    // and rides in the one sent last (Note [overlapped reducer]).
    // Through the interface the trainer uses (Note [gradient sync]).
    const auto sync = makeGradientSync(overlap, c, params, /*bucket_bytes=*/16);
    sync->setMeasureNorms(true);
    NoiseScaleEstimator est;
    std::mt19937_64 rng(1000 + c.rank());
    std::uniform_int_distribution<int64_t> pick(0, pop.x.size(0) - 1);
    const double R = static_cast<double>(world * b);
    double worst = 0;
    for (int64_t s = 0; s < steps; ++s) {
      std::vector<int64_t> idx(b);
      for (auto& i : idx) i = pick(rng);
      auto ix = torch::tensor(idx);
      auto x = pop.x.index_select(0, ix), y = pop.y.index_select(0, ix);
      sync->zeroGrad();
      sync->beforeBackward(/*final_micro=*/true);
      auto loss = lossSum(task, w, bias, x, y) * (scale / R);
      // This rank's own gradient, for the check: autograd::grad does not touch
      // .grad (nor the reducer's hooks).
      const auto own = torch::autograd::grad({loss}, {w, bias}, {}, /*retain_graph=*/true);
      loss.backward();
      sync->sumGradients({});
      const GradSqNorms n = sync->lastNorms();
      ASSERT_TRUE(n.valid);
      {
        const double mine = (own[0].pow(2).sum() + own[1].pow(2).sum()).item<double>();
        const double want_local = c.allreduce(mine, ReduceOp::kSum);
        const double want_summed = (w.grad().pow(2).sum() + bias.grad().pow(2).sum()).item<double>();
        worst = std::max({worst, std::abs(n.local_sum - want_local) / want_local,
                          std::abs(n.summed - want_summed) / want_summed});
      }
      const auto sample = worker::noiseSample(n.local_sum, n.summed, scale, world, b);
      EXPECT_TRUE(est.add(sample.small_sq, sample.b_small, sample.big_sq, sample.b_big));
    }
    if (c.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out.window = est.windowBSimple();
      out.smoothed = est.bSimple();
      out.max_norm_error = worst;
    }
  });
  return out;
}

void expectNear(const char* what, double got, double want, double rel) {
  std::printf("[ noise ] %s: estimate %.2f, exact %.2f (%+.1f %%)\n", what, got, want,
              100 * (got / want - 1));
  EXPECT_NEAR(got, want, rel * want) << what;
}

}  // namespace

TEST(NoiseScale, EstimatorIsExactOnExpectedNorms) {
  // E|G_B|^2 = |G|^2 + tr(S)/B: fed exact expectations, it returns tr(S)/|G|^2.
  NoiseScaleEstimator est(0.9);
  const double g2 = 0.3, tr = 12.0;
  for (int k = 0; k < 5; ++k) EXPECT_TRUE(est.add(g2 + tr / 16, 16, g2 + tr / 64, 64));
  EXPECT_NEAR(est.bSimple(), tr / g2, 1e-9);
  EXPECT_NEAR(est.windowBSimple(), tr / g2, 1e-9);
  EXPECT_NEAR(est.gradSq(), g2, 1e-12);
  EXPECT_NEAR(est.trace(), tr, 1e-9);
  EXPECT_FALSE(est.add(1, 16, 1, 16));  // one batch size: no estimate
  EXPECT_FALSE(est.add(INFINITY, 16, 1, 64));  // an fp16 overflow is skipped
  est.resetWindow();
  EXPECT_LT(est.windowBSimple(), 0);
  EXPECT_EQ(est.steps(), 5);
}

TEST(NoiseScale, LinearRegressionMatchesExactCovarianceReducer) {
  const auto pop = makePopulation(Regression::kLinear, 4000, 8);
  const auto r = estimate(Regression::kLinear, pop, 4, 16, 400, /*overlap=*/true, 1.0);
  EXPECT_LT(r.max_norm_error, 1e-4);
  expectNear("linear, W=4 b=16, reducer (window)", r.window, pop.b_simple, 0.2);
  expectNear("linear, W=4 b=16, reducer (EMA)", r.smoothed, pop.b_simple, 0.35);
}

TEST(NoiseScale, LinearRegressionCopyPathWithLossScale) {
  // The copy path's norms equal a direct computation, and a loss scale cancels.
  const auto pop = makePopulation(Regression::kLinear, 4000, 8);
  const auto r = estimate(Regression::kLinear, pop, 2, 32, 400, /*overlap=*/false, 1024.0);
  EXPECT_LT(r.max_norm_error, 1e-4);
  expectNear("linear, W=2 b=32, copy path, scale 1024", r.window, pop.b_simple, 0.2);
}

TEST(NoiseScale, LogisticRegressionMatchesExactCovariance) {
  const auto pop = makePopulation(Regression::kLogistic, 4000, 6);
  const auto r = estimate(Regression::kLogistic, pop, 4, 8, 500, /*overlap=*/true, 1.0);
  expectNear("logistic, W=4 b=8, reducer", r.window, pop.b_simple, 0.2);
}

// End to end through the Trainer (Note [loss normalisation] as the trainer
// applies it): an MLP on synthetic data with a learning rate of 1e-12, so the
// weights stay where the exact value is computed; per-sample gradients by
// autograd over the whole training set. Batches are drawn without replacement
// within an epoch (a finite-population effect under 2 % at N = 2048, B = 64).
void trainerMatchesExact(bool overlap, int world, int64_t per_gpu, int every = 1,
                         double tolerance = 0.2) {
  const auto cfg = worker::parseConfig(
      "model: {name: mlp, hidden: [16], batchnorm: false}\n"
      "data: {name: synthetic, samples: 2048, shape: [8], classes: 3, noise: 1.5, val_fraction: 0}\n"
      "batch: {global: 64, per_gpu: " + std::to_string(per_gpu) + "}\n"
      "optim: {name: sgd, lr: 1.0e-12, base_batch: 64, momentum: 0, weight_decay: 0}\n"
      "train: {epochs: 16, seed: 4, noise_scale_every: " + std::to_string(every) + "}\n"
      "dist: {overlap: " + std::string(overlap ? "true" : "false") + "}\n",
      "noise.yaml");
  const auto data = worker::loadData(cfg.data, cfg.train.seed, "");
  double exact = 0, estimate = 0;
  int64_t steps = 0;
  std::mutex mu;
  testsupport::runRanks(world, [&](Communicator& c) {
    const auto plan = worker::makePlan(cfg, c.size(), data.train.size(), false);
    worker::StepEngine trainer(cfg, c, data, at::kCPU, plan);
    worker::Sharder sharder(plan, static_cast<uint64_t>(cfg.train.seed));
    for (int64_t epoch = 0; epoch < plan.epochs; ++epoch) {
      sharder.setEpoch(epoch);
      trainer.loader().start(trainer.jobs(sharder, 0, plan.steps_per_epoch), epoch);
      for (int64_t s = 0; s < plan.steps_per_epoch; ++s) {
        trainer.trainStep(sharder.realSamples(s), plan.lrAt(s));
      }
    }
    if (c.rank() != 0) return;
    // Exact: mean and covariance of the per-sample gradients at these weights.
    auto params = trainer.model().trainableParameters();
    const auto& x = data.train.x;
    std::vector<torch::Tensor> rows;
    for (int64_t i = 0; i < x.size(0); ++i) {
      auto out = trainer.model().forward(x.slice(0, i, i + 1).to(torch::kFloat));
      auto loss = torch::nn::functional::cross_entropy(out, data.train.target.slice(0, i, i + 1));
      std::vector<torch::Tensor> flat;
      for (auto& g : torch::autograd::grad({loss}, params)) flat.push_back(g.reshape({-1}));
      rows.push_back(torch::cat(flat).to(torch::kDouble));
    }
    auto grads = torch::stack(rows);
    auto mean = grads.mean(0);
    const double trace = (grads - mean).pow(2).sum(1).mean().item<double>();
    std::lock_guard<std::mutex> lock(mu);
    exact = trace / mean.pow(2).sum().item<double>();
    estimate = trainer.noise().estimator().windowBSimple();
    steps = trainer.noise().estimator().steps();
  });
  EXPECT_EQ(steps, 512 / every);  // 16 epochs x 32 steps, one in `every` measured
  const std::string what = "trainer, mlp, W=" + std::to_string(world) + " m=" +
                           std::to_string(per_gpu) + " G=64, " +
                           (overlap ? "reducer" : "copy path");
  expectNear(what.c_str(), estimate, exact, tolerance);
}

TEST(NoiseScale, TrainerMatchesExactCovarianceReducer) { trainerMatchesExact(true, 2, 32); }
TEST(NoiseScale, TrainerMatchesExactCovarianceCopyPath) { trainerMatchesExact(false, 2, 32); }
// One rank, accumulation 4: the micro-batches (16) and the step (64) are the two sizes.
TEST(NoiseScale, TrainerOneRankUsesMicroBatches) { trainerMatchesExact(true, 1, 16); }
// Note [noise cadence]: the default, one step in 4, on both paths: a quarter of
// the samples (twice the spread, hence the wider tolerance).
TEST(NoiseScale, TrainerMeasuresOneStepInFourReducer) { trainerMatchesExact(true, 2, 32, 4, 0.35); }
TEST(NoiseScale, TrainerMeasuresOneStepInFourCopyPath) { trainerMatchesExact(false, 2, 32, 4, 0.35); }
TEST(NoiseScale, TrainerMeasuresOneStepInFourMicroBatches) { trainerMatchesExact(true, 1, 16, 4, 0.35); }
