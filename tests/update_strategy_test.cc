// Note [update strategy]: the plain data-parallel strategy on 2 ranks (threads over
// a HashStore + Gloo), with the Reducer and with the copy path: what it sums,
// clips, skips and steps, and what it reports.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "tests/thread_ranks.h"
#include "worker/config/config.h"
#include "worker/train/step/update_strategy.h"

using namespace batchdist;
using namespace batchdist::worker;

namespace {

using testsupport::runRanks;

/// dist.overlap: true (the Reducer) or false (the GradientSynchronizer).
class PlainDataParallel : public ::testing::TestWithParam<bool> {
 protected:
  Config config(const std::string& rest) const {
    return parseConfig(rest + "dist: {overlap: " + (GetParam() ? "true" : "false") + "}\n",
                       "update_strategy_test.yaml");
  }
};

/// One step's gradient of w: `x` times the strategy's loss scale, as the trainer
/// multiplies the loss; summed over the ranks. Returns the summed side channel.
collective::SideChannel backward(UpdateStrategy& update, const torch::Tensor& w,
                                 const torch::Tensor& x, const collective::SideChannel& side) {
  update.zeroGrad();
  update.beforeBackward(/*micro=*/0, /*micros=*/1);
  (w * x * static_cast<float>(update.lossScale())).sum().backward();
  return update.sumGradients(side);
}

// Rank r's gradient is (r + 1) x (3, 4): the sum (9, 12) has norm 15, and
// clip_grad_norm 1 makes the step lr x (0.6, 0.8) on both ranks. The side
// channel and the noise scale's norms come back summed.
TEST_P(PlainDataParallel, ClipsTheSummedGradientAndCountsIt) {
  const auto cfg = config("optim: {name: sgd, lr: 0.1, momentum: 0.0, clip_grad_norm: 1.0}\n");
  runRanks(2, [&](collective::Communicator& c) {
    auto w = torch::zeros({2}, torch::requires_grad());
    auto update = makeUpdateStrategy(cfg, c, {w});
    EXPECT_EQ(update->scaler(), nullptr) << "a loss scaler under fp32";
    EXPECT_EQ(update->lossScale(), 1.0);
    update->setMeasureNorms(true);
    const auto side = backward(*update, w, torch::tensor({3.0f, 4.0f}) * float(c.rank() + 1),
                               {c.rank() == 0 ? 1.0 : 0.0, c.rank() == 1 ? 1.0 : 0.0, 0.0});
    EXPECT_EQ(side, (collective::SideChannel{1.0, 1.0, 0.0}));
    EXPECT_TRUE(torch::allclose(w.grad(), torch::tensor({9.0f, 12.0f})));
    const auto& n = update->lastNorms();
    ASSERT_TRUE(n.valid);
    EXPECT_NEAR(n.local_sum, 25.0 + 100.0, 1e-4);  // |g_0|^2 + |g_1|^2
    EXPECT_NEAR(n.summed, 225.0, 1e-4);            // |g_0 + g_1|^2

    EXPECT_TRUE(update->step(0.1));
    EXPECT_TRUE(torch::allclose(w.detach(), torch::tensor({-0.06f, -0.08f}), 1e-5, 1e-7))
        << w;
    const auto& f = update->clipFigures();
    EXPECT_EQ(f.steps, 1);
    EXPECT_EQ(f.clipped, 1);
    EXPECT_NEAR(f.last_norm, 15.0, 1e-5);
    EXPECT_NEAR(f.max_norm, 15.0, 1e-5);
    update->resetClipFigures();
    EXPECT_EQ(update->clipFigures().steps, 0);
  });
}

// fp16: an inf on one rank's gradient makes every rank skip the step (the
// weights untouched, the scale halved); a finite one is unscaled by the scale
// it was computed with before the optimizer steps.
TEST_P(PlainDataParallel, Fp16SkipsAnOverflowOnEveryRankAndUnscalesOtherwise) {
  const auto cfg = config("optim: {name: sgd, lr: 0.5, momentum: 0.0}\n"
                          "train: {precision: fp16, loss_scale: 1024}\n");
  runRanks(2, [&](collective::Communicator& c) {
    auto w = torch::zeros({2}, torch::requires_grad());
    auto update = makeUpdateStrategy(cfg, c, {w});
    ASSERT_NE(update->scaler(), nullptr);
    EXPECT_EQ(update->lossScale(), 1024.0);

    const auto x = c.rank() == 1 ? torch::tensor({INFINITY, 1.0f}) : torch::tensor({1.0f, 1.0f});
    backward(*update, w, x, {});
    EXPECT_FALSE(update->step(0.5)) << "rank " << c.rank() << " stepped over an inf";
    EXPECT_TRUE(torch::equal(w.detach(), torch::zeros({2})));
    EXPECT_EQ(update->scaler()->skippedSteps(), 1);
    EXPECT_EQ(update->lossScale(), 512.0);

    // Each rank (1, 2) x 512: the sum (2, 4) x 512, unscaled to (2, 4); lr 0.5.
    backward(*update, w, torch::tensor({1.0f, 2.0f}), {});
    EXPECT_TRUE(update->step(0.5));
    EXPECT_TRUE(torch::equal(w.detach(), torch::tensor({-1.0f, -2.0f}))) << w;
    EXPECT_EQ(update->scaler()->skippedSteps(), 1);
    EXPECT_EQ(update->clipFigures().steps, 0) << "clipping is off";
  });
}

INSTANTIATE_TEST_SUITE_P(Overlap, PlainDataParallel, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("Reducer") : std::string("CopyPath");
                         });

}  // namespace
