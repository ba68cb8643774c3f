// Note [sharded gradients]: the dist.shard: gradients strategy on 2 and 3 ranks
// (threads over a HashStore + Gloo: the reduce-scatter emulated by an allreduce),
// against the plain strategy: what it keeps, sums, clips, skips and steps, the
// norms it measures per micro-batch, and a rank whose backward fails.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/thread_ranks.h"
#include "worker/config/config.h"
#include "worker/train/shard/sharded_optimizer.h"
#include "worker/train/step/update_strategy.h"

using namespace batchdist;
using namespace batchdist::worker;

namespace {

using testsupport::runRanks;

Config config(const std::string& shard, const std::string& rest) {
  return parseConfig("dist: {shard: " + shard + ", bucket_mb: 0.001}\n" + rest,
                     "sharded_gradients_test.yaml");
}

/// A step of `micros` micro-batches: micro-batch k's gradient of w is x(k)
/// times the loss scale. Returns the summed side channel.
template <typename X>
collective::SideChannel step(UpdateStrategy& u, const std::vector<torch::Tensor>& ws, int64_t micros,
                             X x, const collective::SideChannel& side = {}) {
  u.zeroGrad();
  for (int64_t k = 0; k < micros; ++k) {
    u.beforeBackward(k, micros);
    torch::Tensor loss = torch::zeros({});
    for (std::size_t i = 0; i < ws.size(); ++i) loss = loss + (ws[i] * x(k, i)).sum();
    (loss * static_cast<float>(u.lossScale())).backward();
  }
  return u.sumGradients(side);
}

/// Parameters of 17 x 23 and 150 elements, the same on every rank: under
/// bucket_mb 0.001 (262 floats) two segments of Note [shard layout], whose chunks
/// (196 and 75 elements on 2 ranks, 131 and 50 on 3) end inside parameters.
std::vector<torch::Tensor> params() {
  // Deterministic without torch's global generator, which the rank threads share.
  const auto wave = [](int64_t n, double f) { return torch::sin(torch::arange(n) * f); };
  return {wave(17 * 23, 0.37).view({17, 23}).requires_grad_(), wave(150, 1.3).requires_grad_()};
}

/// Rank r, micro-batch k, parameter i: a gradient that differs by rank and micro-batch.
torch::Tensor gradOf(int rank, int64_t k, std::size_t i, const torch::Tensor& w) {
  const double f = 0.11 * (rank + 1) + 0.07 * static_cast<double>(k) + 0.5 * static_cast<double>(i);
  return torch::cos(torch::arange(w.numel()) * f + static_cast<double>(rank)).view(w.sizes());
}

/// The weights after 3 steps of `micros` micro-batches under `shard` on `world` ranks.
std::vector<torch::Tensor> trainThree(const std::string& shard, const std::string& optim, int world,
                                      int64_t micros) {
  std::vector<torch::Tensor> out;
  runRanks(world, [&](collective::Communicator& c) {
    auto ws = params();
    auto u = makeUpdateStrategy(config(shard, optim), c, ws);
    for (int s = 0; s < 3; ++s) {
      step(*u, ws, micros, [&](int64_t k, std::size_t i) { return gradOf(c.rank(), k + 5 * s, i, ws[i]); });
      EXPECT_TRUE(u->step(0.1));
    }
    if (c.rank() == world - 1) {
      for (auto& w : ws) out.push_back(w.detach().clone());
    }
  });
  return out;
}

void expectSameAsPlain(const std::string& optim, int world, int64_t micros) {
  const auto plain = trainThree("none", optim, world, micros);
  const auto sharded = trainThree("gradients", optim, world, micros);
  ASSERT_EQ(plain.size(), 2u);
  ASSERT_EQ(sharded.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    const double diff = (sharded[i] - plain[i]).abs().max().item<double>();
    EXPECT_LE(diff, 1e-6 * plain[i].abs().max().item<double>())
        << optim << ", W = " << world << ", accumulation " << micros << ", parameter " << i;
  }
}

// With accumulation the sum is taken in another order (over the ranks per
// micro-batch, then over the micro-batches, where plain data parallel sums the
// micro-batches first): SGD, linear in the gradient, keeps the rounding at that
// level. AdamW divides by sqrt(v), which magnifies it at elements whose
// gradients cancel (~2e-6 of max |w| after 3 steps of these waves): it is
// compared without accumulation here and over a real model's 50 steps in
// tests/shard_test.cc.
TEST(ShardedGradients, StepsAsPlainDataParallelWithAccumulation) {
  expectSameAsPlain("optim: {name: sgd, lr: 0.1, momentum: 0.9, weight_decay: 0.01}\n", 2, 3);
  expectSameAsPlain("optim: {name: sgd, lr: 0.1, momentum: 0.9, nesterov: true}\n", 3, 2);
  expectSameAsPlain("optim: {name: adamw, lr: 0.01, weight_decay: 0.1}\n", 3, 1);
}

// Clipping's global norm and LARS's per-layer norms come from the partial sums.
TEST(ShardedGradients, ClippingAndLarsReadTheWholeGradientThroughPartialSums) {
  expectSameAsPlain("optim: {name: sgd, lr: 0.1, momentum: 0.9, clip_grad_norm: 0.5}\n", 3, 1);
  expectSameAsPlain("optim: {name: lars, lr: 0.5, momentum: 0.9, weight_decay: 0.0005}\n", 2, 2);
  expectSameAsPlain("optim: {name: lars, lr: 0.5, momentum: 0.9, clip_grad_norm: 0.5}\n", 3, 3);
}

// Each rank keeps its shard of the summed gradient, no parameter keeps a
// gradient, and the memory says so; the side channel and the norms come back
// summed, with one local gradient per micro-batch.
TEST(ShardedGradients, KeepsOneShardAndMeasuresNormsPerMicroBatch) {
  const auto cfg = config("gradients", "optim: {name: sgd, lr: 0.1, momentum: 0.0, clip_grad_norm: 1.0}\n");
  runRanks(2, [&](collective::Communicator& c) {
    auto w = torch::zeros({2}, torch::requires_grad());
    auto u = makeUpdateStrategy(cfg, c, {w});
    u->setMeasureNorms(true);
    // Rank r, micro-batch k: (k + 1)(r + 1) x (3, 4); the sum over 2 x 2 is 9 x (3, 4).
    const auto side = step(*u, {w}, 2, [&](int64_t k, std::size_t) {
      return torch::tensor({3.0f, 4.0f}) * float((k + 1) * (c.rank() + 1));
    }, {c.rank() == 0 ? 1.0 : 0.0, 1.0, 0.0});
    EXPECT_EQ(side, (collective::SideChannel{1.0, 2.0, 0.0}));
    EXPECT_FALSE(w.grad().defined()) << "the whole gradient was kept";
    const auto& n = u->lastNorms();
    ASSERT_TRUE(n.valid);
    EXPECT_EQ(n.parts, 2);
    EXPECT_NEAR(n.local_sum, 25.0 * (1 + 4 + 4 + 16), 1e-3);  // sum over r, k of |g_rk|^2
    EXPECT_NEAR(n.summed, 25.0 * 81, 1e-3);                    // |sum|^2 = 45^2
    EXPECT_TRUE(u->step(0.1));
    EXPECT_TRUE(torch::allclose(w.detach(), torch::tensor({-0.06f, -0.08f}), 1e-5, 1e-7)) << w;
    EXPECT_EQ(u->clipFigures().clipped, 1);
    EXPECT_NEAR(u->clipFigures().last_norm, 45.0, 1e-4);
    const auto m = u->memory();
    EXPECT_DOUBLE_EQ(m.gradients_mb * 2, m.parameters_mb) << "a shard of 1 of 2 elements";
  });
}

// fp16: an inf in one rank's gradient makes every rank skip; otherwise unscaled.
TEST(ShardedGradients, Fp16SkipsAnOverflowOnEveryRank) {
  const auto cfg = config("gradients", "optim: {name: sgd, lr: 0.5, momentum: 0.0}\n"
                                       "train: {precision: fp16, loss_scale: 1024}\n");
  runRanks(2, [&](collective::Communicator& c) {
    auto w = torch::zeros({2}, torch::requires_grad());
    auto u = makeUpdateStrategy(cfg, c, {w});
    step(*u, {w}, 1, [&](int64_t, std::size_t) {
      return c.rank() == 1 ? torch::tensor({1.0f, INFINITY}) : torch::tensor({1.0f, 1.0f});
    });
    EXPECT_FALSE(u->step(0.5)) << "rank " << c.rank() << " stepped over an inf";
    EXPECT_TRUE(torch::equal(w.detach(), torch::zeros({2})));
    EXPECT_EQ(u->lossScale(), 512.0);
    step(*u, {w}, 1, [&](int64_t, std::size_t) { return torch::tensor({1.0f, 2.0f}); });
    EXPECT_TRUE(u->step(0.5));
    EXPECT_TRUE(torch::equal(w.detach(), torch::tensor({-1.0f, -2.0f}))) << w;
  });
}

// Note [oom back-off]: a rank whose backward fails in the first of three
// micro-batches makes the reduce-scatters the others still make, so no rank
// waits; the step is dropped everywhere and the next one sums as it should.
TEST(ShardedGradients, ARankFailingEarlyInTheWindowStillMakesEveryCollective) {
  const auto cfg = config("gradients", "optim: {name: sgd, lr: 1.0, momentum: 0.0}\n");
  runRanks(3, [&](collective::Communicator& c) {
    auto ws = params();
    auto u = makeUpdateStrategy(cfg, c, ws);
    u->zeroGrad();
    for (int64_t k = 0; k < 3; ++k) {
      u->beforeBackward(k, 3);
      if (c.rank() == 1) {  // fails before its first backward: no gradient at all
        u->backwardFailed();
        break;
      }
      ((ws[0] * 1.0f).sum() + ws[1].sum()).backward();
    }
    const auto side = u->sumGradients({c.rank() == 1 ? 1.0 : 0.0, 0.0, 0.0});
    EXPECT_EQ(side[0], 1.0) << "the failure did not travel";
    u->dropGrad();
    const auto before = ws[0].detach().clone();
    step(*u, ws, 2, [&](int64_t, std::size_t i) { return torch::ones(ws[i].sizes()); });
    EXPECT_TRUE(u->step(1.0));
    // 3 ranks x 2 micro-batches of ones: each element moves by 6.
    EXPECT_TRUE(torch::allclose(ws[0].detach(), before - 6.0f)) << ws[0] - before;
  });
}

// One rank has nothing to shard: the strategy is plain data parallel with the
// sharded optimizer (the checkpoint stays the sharded one).
TEST(ShardedGradients, OnOneRankTheShardIsTheWholeGradient) {
  const auto cfg = config("gradients", "optim: {name: sgd, lr: 0.1}\n");
  runRanks(1, [&](collective::Communicator& c) {
    auto w = torch::zeros({2}, torch::requires_grad());
    auto u = makeUpdateStrategy(cfg, c, {w});
    EXPECT_NE(dynamic_cast<ShardedOptimizer*>(&u->optimizer()), nullptr);
    step(*u, {w}, 1, [&](int64_t, std::size_t) { return torch::tensor({1.0f, 2.0f}); });
    EXPECT_TRUE(w.grad().defined());
    EXPECT_TRUE(u->step(1.0));
    EXPECT_TRUE(torch::allclose(w.detach(), torch::tensor({-1.0f, -2.0f})));
  });
}

}  // namespace
