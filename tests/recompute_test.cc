// Note [activation recompute]: model.recompute: on gives the gradients and the
// loss of off, bitwise on the CPU (the GPT with dropout, whose mask the
// recompute replays; the MLP with dropout), every parameter gets its gradient
// through its own AccumulateGrad once per backward (the hooks the Reducer uses),
// the random stream after a step is the one without recompute, bf16 autocast
// runs, and the config refuses it for models with BatchNorm and TorchScript.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/gpt_fixtures.h"
#include "worker/config/config.h"
#include "worker/model/gpt.h"
#include "worker/model/model.h"
#include "worker/model/precision.h"

using batchdist::ConfigError;
using namespace batchdist::worker;

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
int64_t graphNodes(const at::Tensor& t) {
  std::set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo{t.grad_fn().get()};
  while (!todo.empty()) {
    auto* node = todo.back();
    todo.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges()) todo.push_back(edge.function.get());
  }
  return static_cast<int64_t>(seen.size());
}

std::string configError(const std::string& yaml) {
  try {
    parseConfig(yaml, "test.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
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

TEST(Recompute, ConfigRefusesModelsWithBatchNormAndTorchScript) {
  for (const std::string model : {"resnet18", "resnet50", "cnn"}) {
    const auto e = configError("model: {name: " + model + ", recompute: on}");
    EXPECT_NE(e.find("model.recompute"), std::string::npos) << e;
    EXPECT_NE(e.find("model.name: " + model), std::string::npos) << e;
    EXPECT_NE(e.find("running statistics"), std::string::npos) << e;
    EXPECT_NE(e.find("supported for gpt"), std::string::npos) << e;
  }
  const auto script = configError("model: {name: torchscript, path: m.pt, recompute: on}");
  EXPECT_NE(script.find("model.name: torchscript"), std::string::npos) << script;
  EXPECT_NE(script.find("TorchScript"), std::string::npos) << script;
  const auto mlp = configError("model: {name: mlp, recompute: on}");
  EXPECT_NE(mlp.find("model.batchnorm: false"), std::string::npos) << mlp;
  const auto typo = configError("model: {name: gpt, recompute: auto}");
  EXPECT_NE(typo.find("not one of"), std::string::npos) << typo;
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
