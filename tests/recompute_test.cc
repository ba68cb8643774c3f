// Note [activation recompute]: model.recompute: on gives the gradients and the
// loss of off, bitwise on the CPU (the GPT with dropout, whose mask the
// recompute replays; the MLP with dropout), every parameter gets its gradient
// through its own AccumulateGrad once per backward (the hooks the Reducer uses),
// the random stream after a step is the one without recompute, bf16 autocast
// runs, BatchNorm (mlp, resnet18) updates its running statistics once (Note
// [recompute replay]), and the config refuses it for the cnn and TorchScript.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/config_errors.h"
#include "tests/gpt_fixtures.h"
#include "worker/config/config.h"
#include "worker/model/gpt.h"
#include "worker/model/model.h"
#include "worker/model/precision.h"

using batchdist::ConfigError;
using namespace batchdist::worker;
using batchdist::testsupport::configError;

namespace {

/// One training step's outcome: the loss, every parameter's gradient by name,
/// and a draw from the CPU generator after the step.
struct Outcome {
  at::Tensor loss;
  std::map<std::string, at::Tensor> grads;
  at::Tensor after;
};

/// forward (loss from `loss_of`) and backward, with the generator seeded first.
Outcome step(Model& model, const std::function<at::Tensor(Model&)>& loss_of) {
  torch::manual_seed(7);
  Outcome out;
  out.loss = loss_of(model);
  out.loss.backward();
  for (const auto& [name, p] : model.namedParameters()) out.grads[name] = p.grad();
  out.after = torch::rand({4});
  return out;
}

at::Tensor gptLoss(Model& model) {
  const auto tokens = torch::randint(0, 50, {4, 12}, torch::kLong);
  const auto logits = model.forward(tokens);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, 50}).to(torch::kFloat),
                                              tokens.roll(-1, 1).reshape({-1}));
}

std::unique_ptr<Model> seededGpt(bool recompute, double dropout = 0.1) {
  torch::manual_seed(1);
  return buildGpt(smallGptShape(dropout, recompute));
}

Config mlpConfig(bool recompute) {
  return parseConfig(std::string("model: {name: mlp, batchnorm: false, dropout: 0.2, hidden: "
                                 "[24, 16], recompute: ") +
                         (recompute ? "on" : "off") + "}",
                     "test.yaml");
}

std::unique_ptr<Model> seededMlp(bool recompute) {
  torch::manual_seed(1);
  return buildModel(mlpConfig(recompute).model, {20}, 5);
}

at::Tensor mlpLoss(Model& model) {
  const auto x = torch::randn({8, 20});
  const auto y = torch::randint(0, 5, {8}, torch::kLong);
  return torch::nn::functional::cross_entropy(model.forward(x), y);
}

void expectSame(const Outcome& off, const Outcome& on) {
  EXPECT_TRUE(torch::equal(off.loss, on.loss)) << off.loss.item<double>() << " vs "
                                               << on.loss.item<double>();
  ASSERT_EQ(off.grads.size(), on.grads.size());
  for (const auto& [name, g] : off.grads) {
    ASSERT_TRUE(g.defined()) << name << " has no gradient without recompute";
    ASSERT_TRUE(on.grads.at(name).defined()) << name << " has no gradient with recompute";
    EXPECT_TRUE(torch::equal(g, on.grads.at(name)))
        << name << ": max difference " << (g - on.grads.at(name)).abs().max().item<double>();
  }
  EXPECT_TRUE(torch::equal(off.after, on.after)) << "the random stream after the step differs";
}

/// Counts, per parameter, the post hooks of its AccumulateGrad node that fire
/// (the Reducer's hook, collective/reducer.cc), and whether its gradient is in
/// place when the hook fires. Removes its hooks when destroyed.
class HookCounter {
 public:
  explicit HookCounter(const std::vector<at::Tensor>& params) : fired_(params.size(), 0) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto acc = torch::autograd::impl::grad_accumulator(params[i]);
      const at::Tensor p = params[i];
      const uintptr_t key = acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [this, i, p](const torch::autograd::variable_list& outputs,
                       const torch::autograd::variable_list&) {
            ++fired_[i];
            if (!p.grad().defined()) ++without_grad_;
            return outputs;
          }));
      removers_.push_back([acc, key] { acc->del_post_hook(key); });
    }
  }
  ~HookCounter() {
    for (auto& remove : removers_) remove();
  }
  const std::vector<int>& fired() const { return fired_; }
  int withoutGrad() const { return without_grad_; }

 private:
  std::vector<int> fired_;
  int without_grad_ = 0;
  std::vector<std::function<void()>> removers_;
};

/// The autograd nodes reachable from `t`'s grad_fn: what the graph keeps alive
/// after forward (each node holds the tensors its backward needs).
int64_t graphNodes(const at::Tensor& t, bool count_leaves = true) {
  std::set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo{t.grad_fn().get()};
  while (!todo.empty()) {
    auto* node = todo.back();
    todo.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges()) todo.push_back(edge.function.get());
  }
  if (count_leaves) return static_cast<int64_t>(seen.size());
  return static_cast<int64_t>(std::count_if(seen.begin(), seen.end(), [](torch::autograd::Node* n) {
    return n->name().find("AccumulateGrad") == std::string::npos;
  }));
}

}  // namespace

TEST(Recompute, GptGradientsAndLossAreBitwiseThoseWithout) {
  auto off = seededGpt(false);
  auto on = seededGpt(true);
  const auto a = step(*off, gptLoss);
  const auto b = step(*on, gptLoss);
  expectSame(a, b);
  // Dropout was on: a different mask would have moved the loss.
  auto plain = seededGpt(false, 0.0);
  EXPECT_FALSE(torch::equal(step(*plain, gptLoss).loss, a.loss));
}

TEST(Recompute, MlpGradientsAndLossAreBitwiseThoseWithout) {
  auto off = seededMlp(false);
  auto on = seededMlp(true);
  expectSame(step(*off, mlpLoss), step(*on, mlpLoss));
}

/// Every buffer by name (BatchNorm's running statistics and batch counts).
std::map<std::string, at::Tensor> buffersOf(Model& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, b] : m.namedBuffers()) out[name] = b.clone();
  return out;
}

void expectSameBuffers(Model& off, Model& on) {
  const auto a = buffersOf(off), b = buffersOf(on);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty()) << "no BatchNorm buffers to compare";
  for (const auto& [name, t] : a) {
    EXPECT_TRUE(torch::equal(t, b.at(name))) << name << ": the running statistics differ";
  }
}

// Note [recompute replay]: BatchNorm normalises alike in the replay and updates
// its running statistics once: gradients, loss and buffers bitwise, two steps.
TEST(Recompute, MlpWithBatchNormUpdatesTheRunningStatisticsOnce) {
  const auto build = [](bool recompute) {
    torch::manual_seed(1);
    const auto cfg = parseConfig(std::string("model: {name: mlp, batchnorm: true, dropout: 0.2, "
                                             "hidden: [24, 16], recompute: ") +
                                     (recompute ? "on" : "off") + "}",
                                 "test.yaml");
    return buildModel(cfg.model, {20}, 5);
  };
  auto off = build(false);
  auto on = build(true);
  for (int s = 0; s < 2; ++s) {
    expectSame(step(*off, mlpLoss), step(*on, mlpLoss));
    expectSameBuffers(*off, *on);
  }
}

TEST(Recompute, ResnetBlocksGiveTheSameGradientsAndRunningStatistics) {
  const auto build = [](bool recompute) {
    torch::manual_seed(1);
    const auto cfg = parseConfig(std::string("model: {name: resnet18, recompute: ") +
                                     (recompute ? "on" : "off") + "}",
                                 "test.yaml");
    return buildModel(cfg.model, {3, 16, 16}, 5);
  };
  auto off = build(false);
  auto on = build(true);
  const auto loss = [](Model& m) {
    const auto x = torch::randn({4, 3, 16, 16});
    const auto y = torch::randint(0, 5, {4}, torch::kLong);
    return torch::nn::functional::cross_entropy(m.forward(x), y);
  };
  expectSame(step(*off, loss), step(*on, loss));
  expectSameBuffers(*off, *on);
  // Fewer nodes kept after forward: the blocks' insides are gone (each parameter's
  // AccumulateGrad node stays, with or without recompute, and is not counted).
  torch::manual_seed(7);
  const auto a = graphNodes(loss(*off), /*count_leaves=*/false);
  torch::manual_seed(7);
  const auto b = graphNodes(loss(*on), /*count_leaves=*/false);
  EXPECT_LT(b * 3, a) << b << " nodes with recompute, " << a << " without";
}

TEST(Recompute, SecondStepStillMatches) {
  // Accumulated gradients (a second backward into the same .grad) and a
  // second draw of the masks.
  auto off = seededGpt(false);
  auto on = seededGpt(true);
  step(*off, gptLoss);
  step(*on, gptLoss);
  expectSame(step(*off, gptLoss), step(*on, gptLoss));
}

TEST(Recompute, HooksFireOncePerParameterWithTheGradientInPlace) {
  for (const bool gpt : {true, false}) {
    SCOPED_TRACE(gpt ? "gpt" : "mlp");
    auto model = gpt ? seededGpt(true) : seededMlp(true);
    const auto params = model->trainableParameters();
    ASSERT_FALSE(params.empty());
    HookCounter counter(params);
    torch::manual_seed(7);
    (gpt ? gptLoss(*model) : mlpLoss(*model)).backward();
    for (std::size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(counter.fired()[i], 1) << "parameter " << i;
    }
    EXPECT_EQ(counter.withoutGrad(), 0);
  }
}

TEST(Recompute, FrozenParametersStayWithoutGradient) {
  auto model = seededGpt(true);
  std::string frozen;
  for (auto& [name, p] : model->namedParameters()) {
    if (name.find("h.1.mlp.c_fc") != std::string::npos) {
      p.requires_grad_(false);
      frozen = name;
    }
  }
  ASSERT_FALSE(frozen.empty());
  const auto out = step(*model, gptLoss);
  for (const auto& [name, g] : out.grads) {
    EXPECT_EQ(g.defined(), name.find("h.1.mlp.c_fc") == std::string::npos) << name;
  }
}

TEST(Recompute, GraphAfterForwardKeepsFewerNodes) {
  // What LibTorch 1.13 lets a test see of the memory claim: the graph a forward
  // leaves (its nodes hold the saved activations) is one node per block instead
  // of the block's own. Bytes are not measured here.
  auto off = seededGpt(false);
  auto on = seededGpt(true);
  torch::manual_seed(7);
  const auto a = graphNodes(gptLoss(*off));
  torch::manual_seed(7);
  const auto b = graphNodes(gptLoss(*on));
  EXPECT_LT(b * 2, a) << b << " nodes with recompute, " << a << " without";
}

TEST(Recompute, NoGradForwardIsTheSame) {
  auto off = seededGpt(false);
  auto on = seededGpt(true);
  off->train(false);
  on->train(false);
  torch::NoGradGuard no_grad;
  const auto tokens = torch::randint(0, 50, {2, 10}, torch::kLong);
  EXPECT_TRUE(torch::equal(off->forward(tokens), on->forward(tokens)));
}

TEST(Recompute, Bf16AutocastOnCpuMatchesWithout) {
  auto off = seededGpt(false);
  auto on = seededGpt(true);
  const auto loss = [](Model& m) {
    AutocastScope autocast(at::kCPU, Precision::kBf16);
    return gptLoss(m);
  };
  const auto a = step(*off, loss);
  const auto b = step(*on, loss);
  ASSERT_TRUE(std::isfinite(b.loss.item<double>()));
  expectSame(a, b);
}

TEST(Recompute, SwitchedOnABuiltModelItRunsAsOneBuiltWithIt) {
  // Note [lever switch]: the batch search turns recompute on and off on one model.
  const auto build = [](const std::string& name, bool recompute) {
    if (name == "mlp") return seededMlp(recompute);  // with dropout: the mask replays
    torch::manual_seed(1);
    const auto cfg = parseConfig(std::string("model: {name: resnet18, recompute: ") +
                                     (recompute ? "on" : "off") + "}",
                                 "test.yaml");
    return buildModel(cfg.model, {3, 16, 16}, 5);
  };
  for (const std::string name : {"mlp", "resnet18"}) {
    SCOPED_TRACE(name);
    const auto loss = [&](Model& m) {
      return name == "mlp" ? mlpLoss(m)
                           : torch::nn::functional::cross_entropy(
                                 m.forward(torch::randn({4, 3, 16, 16})),
                                 torch::randint(0, 5, {4}, torch::kLong));
    };
    auto switched = build(name, false);
    auto built_on = build(name, true);
    ASSERT_TRUE(switched->setRecompute(true));
    torch::manual_seed(7);
    const auto on_nodes = graphNodes(loss(*built_on), /*count_leaves=*/false);
    torch::manual_seed(7);
    EXPECT_EQ(graphNodes(loss(*switched), /*count_leaves=*/false), on_nodes);
    auto off = build(name, false);
    expectSame(step(*off, loss), step(*switched, loss));
    ASSERT_TRUE(switched->setRecompute(false));  // and back: the graph of off again
    torch::manual_seed(7);
    const auto off_nodes = graphNodes(loss(*off), /*count_leaves=*/false);
    torch::manual_seed(7);
    EXPECT_EQ(graphNodes(loss(*switched), /*count_leaves=*/false), off_nodes);
    EXPECT_GT(off_nodes, on_nodes);
  }
  auto gpt = seededGpt(false);
  auto gpt_on = seededGpt(true);
  ASSERT_TRUE(gpt->setRecompute(true));
  torch::manual_seed(7);
  const auto a = graphNodes(gptLoss(*gpt));
  torch::manual_seed(7);
  EXPECT_EQ(a, graphNodes(gptLoss(*gpt_on)));
  EXPECT_NE(gpt->describe().find("gpt"), std::string::npos);
  // The cnn has no blocks: it says so, and stays as it is.
  auto cnn = buildModel(parseConfig("model: {name: cnn}", "test.yaml").model, {3, 16, 16}, 5);
  EXPECT_FALSE(cnn->setRecompute(true));
  EXPECT_TRUE(cnn->setRecompute(false));
}

TEST(Recompute, ConfigRefusesTheCnnAndTorchScript) {
  const auto cnn = configError("model: {name: cnn, recompute: on}");
  EXPECT_NE(cnn.find("model.recompute"), std::string::npos) << cnn;
  EXPECT_NE(cnn.find("model.name: cnn"), std::string::npos) << cnn;
  EXPECT_NE(cnn.find("supported for gpt, mlp, resnet18 and resnet50"), std::string::npos) << cnn;
  const auto script = configError("model: {name: torchscript, path: m.pt, recompute: on}");
  EXPECT_NE(script.find("model.name: torchscript"), std::string::npos) << script;
  EXPECT_NE(script.find("TorchScript"), std::string::npos) << script;
  for (const std::string ok : {"model: {name: mlp, recompute: on}",
                               "model: {name: resnet18, recompute: on}",
                               "model: {name: resnet50, recompute: on}"}) {
    EXPECT_EQ(configError(ok), "<no error>") << ok;
  }
  const auto typo = configError("model: {name: mlp, recompute: yes-please}");
  EXPECT_NE(typo.find("not one of"), std::string::npos) << typo;
  // auto is the search's (Note [lever search]): with a fixed per-GPU batch it is refused.
  const auto fixed = configError("model: {name: mlp, recompute: auto}\nbatch: {per_gpu: 32}");
  EXPECT_NE(fixed.find("auto is chosen by the batch search"), std::string::npos) << fixed;
}

TEST(Recompute, ConfigKeyDefaultsOffAndStaysOutOfTheResolvedConfig) {
  const auto plain = parseConfig("model: {name: mlp}", "test.yaml");
  EXPECT_EQ(plain.model.recompute, Recompute::kOff);
  EXPECT_FALSE(plain.resolved["model"].contains("recompute"));
  const auto on = parseConfig("model: {name: gpt, recompute: on}\ndata: {name: tokens, path: t.bin}",
                              "test.yaml");
  EXPECT_EQ(on.model.recompute, Recompute::kOn);
  EXPECT_EQ(on.resolved["model"]["recompute"], "on");
  EXPECT_TRUE(gptShape(on.model).recompute);
}
