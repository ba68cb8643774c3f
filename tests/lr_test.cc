#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>

#include "common/device_compat.h"
#include "common/error.h"
#include "worker/model/model.h"
#include "worker/model/optimizer.h"
#include "worker/plan/plan.h"

using namespace batchdist::worker;

namespace {
Plan planFor(const std::string& yaml, int64_t world, int64_t n) {
  return makePlan(parseConfig(yaml, "t.yaml"), world, n, false);
}
}  // namespace

TEST(Lr, ScalingRulesTable) {
  struct Row {
    LrScaling rule;
    int64_t G;
    double want;
  };
  const Row rows[] = {{LrScaling::kLinear, 256, 0.1}, {LrScaling::kLinear, 1024, 0.4},
                      {LrScaling::kLinear, 64, 0.025}, {LrScaling::kSqrt, 1024, 0.2},
                      {LrScaling::kSqrt, 64, 0.05},    {LrScaling::kNone, 1024, 0.1}};
  for (const auto& r : rows) {
    EXPECT_NEAR(scaledLr(0.1, 256, r.G, r.rule), r.want, 1e-12) << toString(r.rule) << " " << r.G;
  }
}

TEST(Lr, PlanScalesWithTheGlobalBatchAndIsRecomputedWhenItChanges) {
  const std::string yaml = "optim: {lr: 0.1, base_batch: 256}\nbatch: {per_gpu: 64}\n";
  EXPECT_NEAR(planFor(yaml, 1, 10000).lr, 0.025, 1e-12);
  EXPECT_NEAR(planFor(yaml, 8, 10000).lr, 0.2, 1e-12);
  const auto cfg = parseConfig(yaml, "t.yaml");
  EXPECT_NEAR(makePlan(cfg, 8, 10000, false, /*per_gpu_override=*/128).lr, 0.4, 1e-12);
}

TEST(Lr, WarmupRisesLinearlyToTheScaledRate) {
  const auto p = planFor(
      "optim: {lr: 0.1, base_batch: 32, warmup_steps: 4}\nbatch: {global: 64}\n"
      "train: {epochs: 2}\n",
      1, 640);
  EXPECT_NEAR(p.lr, 0.2, 1e-12);
  EXPECT_NEAR(p.lrAt(0), 0.05, 1e-12);
  EXPECT_NEAR(p.lrAt(1), 0.10, 1e-12);
  EXPECT_NEAR(p.lrAt(2), 0.15, 1e-12);
  EXPECT_NEAR(p.lrAt(3), 0.20, 1e-12);
  EXPECT_NEAR(p.lrAt(4), 0.20, 1e-12);
  EXPECT_NEAR(p.lrAt(19), 0.20, 1e-12);
}

TEST(Lr, WarmupEpochsConvertToSteps) {
  const auto p = planFor("optim: {warmup_epochs: 1.5}\nbatch: {global: 64}\n", 2, 640);
  EXPECT_EQ(p.steps_per_epoch, 10);
  EXPECT_EQ(p.warmup_steps, 15);
}

TEST(Lr, CosineEndsAtMinLrAndPassesTheMidpoint) {
  const auto p = planFor(
      "optim: {lr: 1.0, base_batch: 10, lr_scaling: none, schedule: cosine, min_lr: 0.1}\n"
      "batch: {global: 10}\ntrain: {epochs: 1}\n",
      1, 101);
  ASSERT_EQ(p.total_steps, 10);
  EXPECT_NEAR(p.lrAt(0), 1.0, 1e-12);
  EXPECT_NEAR(p.lrAt(5), 0.55, 1e-12);
  EXPECT_NEAR(p.lrAt(10), 0.1, 1e-12);
  for (int s = 1; s < 10; ++s) EXPECT_LT(p.lrAt(s), p.lrAt(s - 1));
}

TEST(Lr, StepScheduleMultipliesAtMilestones) {
  const auto p = planFor(
      "optim: {lr: 1.0, base_batch: 10, schedule: step, milestones: [2, 4], step_gamma: 0.5}\n"
      "batch: {global: 10}\ntrain: {epochs: 5}\n",
      1, 100);
  EXPECT_NEAR(p.lrAt(0), 1.0, 1e-12);
  EXPECT_NEAR(p.lrAt(19), 1.0, 1e-12);
  EXPECT_NEAR(p.lrAt(20), 0.5, 1e-12);
  EXPECT_NEAR(p.lrAt(40), 0.25, 1e-12);
}

TEST(Lars, TrustRatioMatchesAHandComputation) {
  // eta * |w| / (|g| + wd * |w|) = 0.001 * 5 / (0.5 + 0.01 * 5) = 0.005 / 0.55
  EXPECT_NEAR(larsTrustRatio(5.0, 0.5, 0.01, 0.001), 0.005 / 0.55, 1e-15);
  EXPECT_EQ(larsTrustRatio(0.0, 0.5, 0.01, 0.001), 1.0);
  EXPECT_EQ(larsTrustRatio(5.0, 0.0, 0.01, 0.001), 1.0);
}

TEST(Lars, StepScalesWeightsAndExcludesBiasAndBatchNorm) {
  torch::manual_seed(0);
  auto cfg = parseConfig("optim: {name: lars, momentum: 0.0, weight_decay: 0.01, "
                         "trust_coefficient: 0.001}",
                         "t.yaml")
                 .optim;
  torch::nn::Linear lin(3, 2);
  torch::NoGradGuard guard;
  lin->weight.copy_(torch::tensor({{3.0, 0.0, 0.0}, {0.0, 4.0, 0.0}}));  // |w| = 5
  lin->bias.copy_(torch::tensor({1.0, -1.0}));
  lin->weight.mutable_grad() = torch::tensor({{0.3, 0.0, 0.0}, {0.0, 0.4, 0.0}});  // |g| = 0.5
  lin->bias.mutable_grad() = torch::tensor({0.2, 0.2});
  auto w0 = lin->weight.clone();
  auto b0 = lin->bias.clone();
  auto opt = makeOptimizer(cfg, lin->parameters());
  opt->step(2.0);
  const double trust = 0.001 * 5.0 / (0.5 + 0.01 * 5.0);
  auto want_w = w0 - 2.0 * trust * (torch::tensor({{0.3, 0.0, 0.0}, {0.0, 0.4, 0.0}}) + 0.01 * w0);
  EXPECT_TRUE(torch::allclose(lin->weight, want_w, 1e-6, 1e-7));
  // Bias: plain SGD, no trust ratio, no weight decay.
  EXPECT_TRUE(torch::allclose(lin->bias, b0 - 2.0 * torch::tensor({0.2, 0.2}), 1e-6, 1e-7));
}

// GPT-2's (and nanoGPT's) AdamW: weight decay on the weights only. With zero
// gradients Adam's own update is 0, so what moves is the decoupled decay alone:
// w <- w (1 - lr wd), the bias unchanged.
TEST(Adamw, WeightDecayOnlyOnTensorsOfTwoOrMoreDimensions) {
  auto cfg = parseConfig("optim: {name: adamw, weight_decay: 0.1}", "t.yaml").optim;
  torch::nn::Linear lin(3, 2);
  torch::nn::LayerNorm norm(torch::nn::LayerNormOptions({2}));
  auto params = lin->parameters();
  for (const auto& p : norm->parameters()) params.push_back(p);
  torch::NoGradGuard guard;
  for (auto& p : params) p.mutable_grad() = torch::zeros_like(p);
  std::vector<torch::Tensor> before;
  for (const auto& p : params) before.push_back(p.clone());
  auto opt = makeOptimizer(cfg, params);
  opt->step(0.5);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto want = params[i].dim() >= 2 ? before[i] * (1 - 0.5 * 0.1) : before[i];
    EXPECT_TRUE(torch::allclose(params[i], want, 1e-6, 1e-7)) << "parameter " << i << " of dim "
                                                              << params[i].dim();
  }
  // The state round-trips through a checkpoint's bytes (two parameter groups).
  const auto bytes = opt->saveState();
  auto again = makeOptimizer(cfg, params);
  EXPECT_NO_THROW(again->loadState(bytes, torch::kCPU));
  // ... and another optimizer's state is refused with a message, not a crash.
  auto sgd = makeOptimizer(parseConfig("optim: {name: sgd}", "t.yaml").optim, params);
  try {
    again->loadState(sgd->saveState(), torch::kCPU);
    ADD_FAILURE() << "sgd's state was taken by adamw";
  } catch (const batchdist::Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit this optimizer"), std::string::npos) << e.what();
  }
}

// Note [gradient clipping]: the global L2 norm over every gradient.
TEST(ClipGradNorm, ScalesToTheBoundAndReturnsTheNormBefore) {
  auto a = torch::zeros({2, 2}, torch::requires_grad());
  auto b = torch::zeros({1}, torch::requires_grad());
  auto c = torch::zeros({3}, torch::requires_grad());  // no gradient: left out
  a.mutable_grad() = torch::tensor({{3.0, 0.0}, {0.0, 0.0}});
  b.mutable_grad() = torch::tensor({4.0});
  EXPECT_NEAR(clipGradNorm({a, b, c}, 1.0), 5.0, 1e-12);
  EXPECT_NEAR(a.grad()[0][0].item<double>(), 3.0 / 5.0, 1e-6);
  EXPECT_NEAR(b.grad()[0].item<double>(), 4.0 / 5.0, 1e-6);
  EXPECT_FALSE(c.grad().defined());
  // Under the bound: untouched.
  EXPECT_NEAR(clipGradNorm({a, b}, 2.0), 1.0, 1e-6);
  EXPECT_NEAR(b.grad()[0].item<double>(), 4.0 / 5.0, 1e-6);
  // A non-finite norm leaves the gradients for the scaler or the health check.
  b.mutable_grad() = torch::tensor({INFINITY});
  EXPECT_TRUE(std::isinf(clipGradNorm({a, b}, 1.0)));
  EXPECT_NEAR(a.grad()[0][0].item<double>(), 3.0 / 5.0, 1e-6);
}

// Note [multi-tensor step]: the multi-tensor steps are torch::optim's bitwise;
// the fused kernels (Note [fused optimizer steps]), where this LibTorch has them,
// within 1e-6 relative (else they step as multi-tensor: bitwise).
bool sameUpdate(const torch::Tensor& ours, const torch::Tensor& theirs, StepKernels kernels) {
  if (resolveStepKernels(kernels, false) == StepKernels::kFused) {
    // relative to the tensor's scale: an element near 0 (a bias, a moment) has
    // no relative precision of its own worth asking for
    const double scale = theirs.abs().max().item<double>();
    return (ours - theirs).abs().max().item<double>() <= 1e-6 * scale + 1e-12;
  }
  return torch::equal(ours, theirs);
}

// sgd's step over the whole group is torch::optim::SGD's, step after step, and
// leaves the same momentum buffers (the checkpoint's state).
void expectSgdIsTorchOptimSgd(StepKernels kernels) {
  struct Case {
    double momentum, weight_decay;
    bool nesterov;
  };
  for (const Case c : {Case{0, 0, false}, Case{0, 1e-4, false}, Case{0.9, 0, false},
                       Case{0.9, 5e-4, false}, Case{0.9, 5e-4, true}}) {
    SCOPED_TRACE(batchdist::strCat("momentum ", c.momentum, ", weight decay ", c.weight_decay,
                        c.nesterov ? ", nesterov" : ""));
    torch::manual_seed(7);
    std::vector<torch::Tensor> ours, theirs;
    for (const auto& shape : std::vector<std::vector<int64_t>>{{8, 5}, {5}, {3, 2, 2}, {4}}) {
      ours.push_back(torch::randn(shape).requires_grad_());
      theirs.push_back(ours.back().detach().clone().requires_grad_());
    }
    OptimConfig cfg;
    cfg.momentum = c.momentum;
    cfg.weight_decay = c.weight_decay;
    cfg.nesterov = c.nesterov;
    cfg.kernels = kernels;
    auto opt = makeOptimizer(cfg, ours);
    torch::optim::SGD reference(theirs, torch::optim::SGDOptions(0.1)
                                            .momentum(c.momentum)
                                            .nesterov(c.nesterov)
                                            .weight_decay(c.weight_decay));
    for (int step = 0; step < 4; ++step) {
      for (std::size_t i = 0; i < ours.size(); ++i) {
        if (step == 1 && i == 3) continue;  // a parameter without a gradient this step
        const auto g = torch::randn(ours[i].sizes());
        ours[i].mutable_grad() = g.clone();
        theirs[i].mutable_grad() = g.clone();
      }
      const double lr = 0.05 * (step + 1);
      opt->step(lr);
      static_cast<torch::optim::SGDOptions&>(reference.param_groups()[0].options()).lr(lr);
      reference.step();
      for (std::size_t i = 0; i < ours.size(); ++i) {
        EXPECT_TRUE(sameUpdate(ours[i], theirs[i], kernels)) << "step " << step << ", tensor " << i;
      }
      opt->zeroGrad();
      reference.zero_grad();
      for (std::size_t i = 0; i < ours.size(); ++i) {
        ours[i].mutable_grad() = torch::Tensor();
        theirs[i].mutable_grad() = torch::Tensor();
      }
    }
    if (c.momentum > 0) {
      for (std::size_t i = 0; i < ours.size(); ++i) {
        const auto& st = static_cast<torch::optim::SGDParamState&>(
            *reference.state().at(batchdist::compat::optimizerStateKey(reference.state(), theirs[i])));
        EXPECT_TRUE(sameUpdate(opt->stateVector(i, 0), st.momentum_buffer().reshape({-1}), kernels))
            << "tensor " << i;
      }
    }
  }
}

TEST(MultiTensorStep, SgdIsTorchOptimSgdBitwise) { expectSgdIsTorchOptimSgd(StepKernels::kMultiTensor); }
TEST(FusedStep, SgdIsTorchOptimSgd) {
  expectSgdIsTorchOptimSgd(StepKernels::kFused);
  std::vector<torch::Tensor> params{torch::zeros({2}, torch::requires_grad())};
  OptimConfig fused;
  fused.kernels = StepKernels::kFused;
  EXPECT_EQ(makeOptimizer(fused, params)->kernels(),
            batchdist::compat::kHasFusedOptimizerSteps ? StepKernels::kFused : StepKernels::kMultiTensor);
}

// ... and adamw's, in its two groups (weights decayed, the rest not), with tensors
// whose step counts differ (as a sharded checkpoint may set them): torch::optim::AdamW's.
void expectAdamwIsTorchOptimAdamw(StepKernels kernels) {
  torch::manual_seed(11);
  std::vector<torch::Tensor> ours, theirs;
  for (const auto& shape : std::vector<std::vector<int64_t>>{{6, 4}, {4}, {4, 3}, {3}}) {
    ours.push_back(torch::randn(shape).requires_grad_());
    theirs.push_back(ours.back().detach().clone().requires_grad_());
  }
  OptimConfig cfg = parseConfig("optim: {name: adamw, weight_decay: 0.1}", "t.yaml").optim;
  cfg.kernels = kernels;
  auto opt = makeOptimizer(cfg, ours);
  const auto options = [&](double decay) {
    return torch::optim::AdamWOptions(cfg.lr).betas({cfg.beta1, cfg.beta2}).eps(cfg.eps).weight_decay(decay);
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{theirs[0], theirs[2]},
                      std::make_unique<torch::optim::AdamWOptions>(options(cfg.weight_decay)));
  groups.emplace_back(std::vector<torch::Tensor>{theirs[1], theirs[3]},
                      std::make_unique<torch::optim::AdamWOptions>(options(0.0)));
  torch::optim::AdamW reference(std::move(groups), options(cfg.weight_decay));
  for (int step = 0; step < 5; ++step) {
    for (std::size_t i = 0; i < ours.size(); ++i) {
      if (step == 1 && i % 2 == 0) continue;  // these tensors fall one step behind the others
      const auto g = torch::randn(ours[i].sizes());
      ours[i].mutable_grad() = g.clone();
      theirs[i].mutable_grad() = g.clone();
    }
    const double lr = 1e-3 * (step + 1);
    opt->step(lr);
    for (auto& group : reference.param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    }
    reference.step();
    for (std::size_t i = 0; i < ours.size(); ++i) {
      EXPECT_TRUE(sameUpdate(ours[i], theirs[i], kernels)) << "step " << step << ", tensor " << i;
      ours[i].mutable_grad() = torch::Tensor();
      theirs[i].mutable_grad() = torch::Tensor();
    }
  }
  for (std::size_t i = 0; i < ours.size(); ++i) {
    const auto& st = static_cast<torch::optim::AdamWParamState&>(
        *reference.state().at(batchdist::compat::optimizerStateKey(reference.state(), theirs[i])));
    EXPECT_EQ(opt->stepCount(i), static_cast<int64_t>(st.step())) << "tensor " << i;
    EXPECT_TRUE(sameUpdate(opt->stateVector(i, 0), st.exp_avg().reshape({-1}), kernels)) << "tensor " << i;
    EXPECT_TRUE(sameUpdate(opt->stateVector(i, 1), st.exp_avg_sq().reshape({-1}), kernels))
        << "tensor " << i;
  }
  EXPECT_EQ(opt->stepCount(1), 5);
  EXPECT_EQ(opt->stepCount(0), 4);  // skipped once: two step counts in one group
}

TEST(MultiTensorStep, AdamwIsTorchOptimAdamwBitwise) {
  expectAdamwIsTorchOptimAdamw(StepKernels::kMultiTensor);
}
TEST(FusedStep, AdamwIsTorchOptimAdamw) { expectAdamwIsTorchOptimAdamw(StepKernels::kFused); }

// lars by the multi-tensor ops (its trust ratios on the device) is its step
// tensor by tensor: weights, a bias, a tensor without a gradient one step, and
// the whole-layer gradient norms given (as the sharded strategies give them).
TEST(MultiTensorStep, LarsIsItsPerTensorStep) {
  for (const bool given : {false, true}) {
    SCOPED_TRACE(given ? "norms given" : "norms read");
    torch::manual_seed(5);
    std::vector<torch::Tensor> ours, theirs;
    for (const auto& shape : std::vector<std::vector<int64_t>>{{6, 4}, {4}, {3, 2, 2, 2}, {3}}) {
      ours.push_back(torch::randn(shape).requires_grad_());
      theirs.push_back(ours.back().detach().clone().requires_grad_());
    }
    ours[2].detach().zero_();  // a weight of norm 0: trust ratio 1
    theirs[2].detach().zero_();
    auto cfg = parseConfig("optim: {name: lars, momentum: 0.9, weight_decay: 0.01}", "t.yaml").optim;
    cfg.kernels = StepKernels::kMultiTensor;
    auto multi = makeOptimizer(cfg, ours);
    cfg.kernels = StepKernels::kPerTensor;
    auto each = makeOptimizer(cfg, theirs);
    EXPECT_EQ(multi->kernels(), StepKernels::kMultiTensor);
    EXPECT_EQ(each->kernels(), StepKernels::kPerTensor);
    for (int step = 0; step < 4; ++step) {
      std::vector<double> norms;
      for (std::size_t i = 0; i < ours.size(); ++i) {
        const bool skipped = step == 1 && i == 0;
        const auto g = torch::randn(ours[i].sizes());
        ours[i].mutable_grad() = skipped ? torch::Tensor() : g.clone();
        theirs[i].mutable_grad() = skipped ? torch::Tensor() : g.clone();
        norms.push_back(skipped ? 0.0 : 2 * g.norm().item<double>());
      }
      if (given) {
        multi->setWholeGradNorms(norms);
        each->setWholeGradNorms(norms);
      }
      multi->step(0.1);
      each->step(0.1);
      for (std::size_t i = 0; i < ours.size(); ++i) {
        EXPECT_TRUE(torch::allclose(ours[i], theirs[i], 1e-6, 1e-9)) << "step " << step << ", tensor " << i;
        EXPECT_TRUE(torch::allclose(multi->stateVector(i, 0), each->stateVector(i, 0), 1e-6, 1e-9));
      }
    }
    EXPECT_FALSE(torch::equal(ours[2], torch::zeros_like(ours[2])));  // it moved
  }
}

// Note [channels last]: a channels-last weight's state is made laid out as the
// weight, so the fused kernels take it (they need the layouts to agree); a state
// laid out otherwise (a checkpoint written under the other memory format) steps
// by the multi-tensor ops instead. Either way: the per-tensor step's update and
// state, in the tensors' logical order.
TEST(FusedStep, ChannelsLastWeightsStepAsPerTensor) {
  const auto cl = at::MemoryFormat::ChannelsLast;
  for (const std::string name : {"sgd", "adamw"}) {
    for (const auto kernels : {StepKernels::kMultiTensor, StepKernels::kFused}) {
      SCOPED_TRACE(name + (kernels == StepKernels::kFused ? ", fused" : ", multi-tensor"));
      torch::manual_seed(3);
      std::vector<torch::Tensor> ours{torch::randn({4, 3, 3, 3}).contiguous(cl).requires_grad_(),
                                      torch::randn({4}).requires_grad_()};
      std::vector<torch::Tensor> theirs, later;
      for (const auto& t : ours) theirs.push_back(t.detach().clone().requires_grad_());
      auto cfg = parseConfig("optim: {name: " + name + ", momentum: 0.9, weight_decay: 0.01}", "t.yaml").optim;
      cfg.kernels = kernels;
      auto opt = makeOptimizer(cfg, ours);
      cfg.kernels = StepKernels::kPerTensor;
      auto reference = makeOptimizer(cfg, theirs);
      std::unique_ptr<Optimizer> reloaded;  // over contiguous copies, from step 2 on
      for (int step = 0; step < 4; ++step) {
        if (step == 2) {
          for (const auto& t : ours) later.push_back(t.detach().clone(at::MemoryFormat::Contiguous).requires_grad_());
          cfg.kernels = kernels;
          reloaded = makeOptimizer(cfg, later);
          reloaded->loadState(opt->saveState(), at::kCPU);
        }
        for (std::size_t i = 0; i < ours.size(); ++i) {
          const auto g = torch::randn(ours[i].sizes());
          ours[i].mutable_grad() = g.dim() == 4 ? g.contiguous(cl) : g.clone();
          theirs[i].mutable_grad() = g.clone();
          if (reloaded) later[i].mutable_grad() = g.clone();
        }
        opt->step(0.05);
        reference->step(0.05);
        if (reloaded) reloaded->step(0.05);
        for (std::size_t i = 0; i < ours.size(); ++i) {
          EXPECT_TRUE(sameUpdate(ours[i], theirs[i], kernels)) << "step " << step << ", tensor " << i;
          for (std::size_t k = 0; k < opt->stateNames().size(); ++k) {
            EXPECT_TRUE(sameUpdate(opt->stateVector(i, k), reference->stateVector(i, k), kernels))
                << "step " << step << ", tensor " << i << ", " << opt->stateNames()[k];
          }
          if (reloaded) {
            EXPECT_TRUE(sameUpdate(later[i], theirs[i], kernels)) << "reloaded, step " << step << ", tensor " << i;
          }
        }
      }
      EXPECT_TRUE(ours[0].is_contiguous(cl));
    }
  }
}
