// Note [module loss]: a TorchScript module whose forward(x, target) returns its own
// loss: which configs choose it (Note [task choice]) and the errors, what forward may
// return (a [N] tensor, a tuple, a dict) and what is refused, the padding weights,
// the evaluation sums, and npy targets of any shape. The modules are scripted here
// (torch::jit::Module::define) and saved to a scratch directory; the committed ones
// (tests/data/make_loss_modules.py) train in module_loss_mpi_test.cc and task_e2e.sh.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "tests/config_errors.h"
#include "tests/image_fixtures.h"
#include "tests/scratch_dir.h"
#include "worker/data/data.h"
#include "worker/data/loader.h"
#include "worker/data/sources/npy.h"
#include "worker/model/model.h"
#include "worker/task/task.h"

using namespace batchdist::worker;
using batchdist::testsupport::errorOf;

namespace {

/// A module with parameter w = [1, 2] and `forward`'s TorchScript source, saved as
/// DIR/NAME.pt; its path.
std::string scriptFile(const std::string& dir, const std::string& name, const std::string& forward) {
  torch::jit::Module m("M");
  m.register_parameter("w", torch::tensor({1.0f, 2.0f}, torch::requires_grad()), /*is_buffer=*/false);
  m.define(forward);
  const auto path = dir + "/" + name + ".pt";
  m.save(path);
  return path;
}

constexpr const char* kPerSample = R"(
def forward(self, x, target):
    err = x * self.w - target
    return (err * err).mean(1)
)";
constexpr const char* kTuple = R"(
def forward(self, x, target):
    err = x * self.w - target
    return ((err * err).mean(1), err.abs().mean(), x)
)";
constexpr const char* kDict = R"(
def forward(self, x, target):
    err = x * self.w - target
    return {"loss": (err * err).mean(1), "mae": err.abs().mean()}
)";
constexpr const char* kMean = R"(
def forward(self, x, target):
    err = x * self.w - target
    return (err * err).mean()
)";
constexpr const char* kOneInput = R"(
def forward(self, x):
    return x * self.w
)";

/// The model of a module file and its task, probed on `train` as the trainer does.
struct Built {
  std::unique_ptr<Model> model;
  std::unique_ptr<Task> task;
};
Built build(const std::string& path, const Dataset& train, bool padded = false) {
  ModelConfig mc;
  mc.name = ModelName::kTorchscript;
  mc.path = path;
  Built b{buildModel(mc, {2}, 0), makeTask(TaskKind::kModuleLoss, path)};
  b.task->probe(*b.model, train, {2}, Autocast{}, padded);
  return b;
}

Dataset trainSet() {
  Dataset d;
  d.x = torch::randn({5, 2});
  d.target = torch::randn({5, 2});
  d.sample_shape = {2};
  return d;
}

/// ((x * [1, 2] - target)^2).mean(1), the per-sample loss of the modules above.
at::Tensor expectedLoss(const at::Tensor& x, const at::Tensor& t) {
  return (x * torch::tensor({1.0f, 2.0f}) - t).square().mean(1);
}

Config parsed(const std::string& yaml) { return parseConfig(yaml, "t.yaml"); }

}  // namespace

TEST(ModuleLoss, ChosenForAForwardThatTakesTheTargetAndMismatchesAreNamed) {
  const batchdist::testsupport::ScratchDir dir("module_choice");
  const auto own = scriptFile(dir.string(), "own", kDict);
  const auto plain = scriptFile(dir.string(), "plain", kOneInput);
  const std::string npy = "data: {name: npy, path: d}\n";
  auto cfg = parsed("model: {name: torchscript, path: " + own + "}\n" + npy);
  EXPECT_TRUE(trainsModuleLoss(cfg));
  auto c = chooseTask(cfg, DataSplit{});
  EXPECT_EQ(c.kind, TaskKind::kModuleLoss);
  EXPECT_EQ(c.why, "task.name: auto; " + own + "'s forward takes (x, target)");
  EXPECT_EQ(c.outputs, 0);
  EXPECT_EQ(c.module, own);
  EXPECT_EQ(parseEnum<TaskKind>("module_loss"), TaskKind::kModuleLoss);
  c = chooseTask(parsed("task: {name: module_loss}\nmodel: {name: torchscript, path: " + own + "}\n" + npy),
                 DataSplit{});
  EXPECT_EQ(c.why, "task.name: module_loss");
  // Token windows: a module with its own loss reads them; model.seq_len and
  // model.vocab stay in the resolved config (they cut the windows).
  const std::string tokens = "data: {name: tokens, path: t.bin}\n";
  cfg = parsed("model: {name: torchscript, path: " + own + ", seq_len: 16}\n" + tokens);
  EXPECT_EQ(chooseTask(cfg, DataSplit{}).kind, TaskKind::kModuleLoss);
  EXPECT_EQ(cfg.resolved["model"]["seq_len"], 16);
  EXPECT_FALSE(parsed("model: {name: torchscript, path: " + own + "}\n" + npy).resolved["model"].contains("seq_len"));

  // A forward that takes one input is not this task.
  cfg = parsed("model: {name: torchscript, path: " + plain + "}\n" + npy);
  EXPECT_FALSE(trainsModuleLoss(cfg));
  EXPECT_EQ(errorOf([&] { chooseTask(parsed("task: {name: module_loss}\nmodel: {name: torchscript, path: " + plain + "}\n" + npy), DataSplit{}); }),
            "t.yaml: task.name: module_loss calls forward(x, target), but " + plain +
                "'s forward takes one input (x); return the loss from forward(x, target) "
                "(docs/models.md), or use task.name: auto");
  EXPECT_EQ(errorOf([&] { chooseTask(parsed("model: {name: torchscript, path: " + plain + "}\n" + tokens), DataSplit{}); }),
            "t.yaml: model.path: " + plain + ": forward takes one input (x), but on data.name: "
            "tokens a TorchScript module trains with its own loss: forward(x, target) returning "
            "one loss per window (docs/models.md); or use model.name: gpt");
  EXPECT_EQ(errorOf([&] { chooseTask(parsed("task: {name: module_loss}\n" + npy), DataSplit{}); }),
            "t.yaml: task.name: module_loss trains a TorchScript module's own loss, but model.name "
            "is mlp; use model.name: torchscript, a module whose forward(x, target) returns it "
            "(docs/models.md), or task.name: auto");
  EXPECT_EQ(errorOf([&] { chooseTask(parsed("task: {name: regression}\nmodel: {name: torchscript, path: " + own + "}\n" + npy), DataSplit{}); }),
            "t.yaml: task.name: regression computes the loss from the model's outputs, but " + own +
                "'s forward takes (x, target) and returns its own loss; use task.name: "
                "module_loss (or auto)");
  EXPECT_EQ(errorOf([&] { chooseTask(parsed("model: {name: torchscript, path: " + own + ", outputs: 3}\n" + npy), DataSplit{}); }),
            "t.yaml: model.outputs: 3, but " + own + " returns its own loss: there is no head to "
            "size; leave model.outputs out");
  EXPECT_EQ(errorOf([&] { parsed("task: {name: language_model}\nmodel: {name: torchscript, path: " + own + "}\n" + tokens); }),
            "t.yaml: task.name: language_model trains model.name: gpt; a TorchScript module trains "
            "on token windows with its own loss: use task.name: module_loss (or auto), its "
            "forward(x, target) returning one loss per window (docs/models.md)");
}

// The three contracts give the same per-sample loss, weighed by the batch's weights
// (padding 0); the tuple's and the dict's scalar entries are the metrics.
TEST(ModuleLoss, PerSampleTupleAndDictAreWeighedAndTheirMetricsNamed) {
  const batchdist::testsupport::ScratchDir dir("module_contracts");
  const auto train = trainSet();
  const auto x = torch::randn({4, 2}), t = torch::randn({4, 2});
  const auto w = torch::tensor({1.0f, 0.0f, 1.0f, 1.0f});
  const auto want = (expectedLoss(x, t) * w).sum();
  const std::vector<std::pair<const char*, std::vector<std::string>>> cases = {
      {kPerSample, {}}, {kTuple, {"metric_1"}}, {kDict, {"mae"}}};
  int i = 0;
  for (const auto& [source, names] : cases) {
    auto b = build(scriptFile(dir.string(), "m" + std::to_string(i++), source), train, /*padded=*/true);
    EXPECT_EQ(b.task->kind(), TaskKind::kModuleLoss);
    const auto loss = b.task->forwardLoss(*b.model, Batch{x, t, w}, Autocast{});
    EXPECT_EQ(loss.dim(), 0);
    EXPECT_EQ(loss.scalar_type(), torch::kFloat);
    EXPECT_NEAR(loss.item<double>(), want.item<double>(), 1e-5) << source;
    EXPECT_EQ(b.task->sumCount(), 1 + static_cast<int>(names.size()));
    const auto m = b.task->metrics(std::vector<double>(b.task->sumCount(), 1.0), 2.0);
    ASSERT_EQ(m.size(), 1 + names.size());
    EXPECT_EQ(m[0].name, "loss");
    for (std::size_t k = 0; k < names.size(); ++k) EXPECT_EQ(m[k + 1].name, names[k]);
    loss.backward();  // the module's parameters get a gradient through the task
    EXPECT_TRUE(b.model->parameters()[0].grad().defined());
  }
}

// Evaluation: the summed loss and each metric times its batch's samples, so the
// metrics are means over every validation sample.
TEST(ModuleLoss, EvaluationSumsAreMeansOverSamples) {
  const batchdist::testsupport::ScratchDir dir("module_eval");
  auto b = build(scriptFile(dir.string(), "dict", kDict), trainSet());
  const auto x1 = torch::randn({3, 2}), t1 = torch::randn({3, 2});
  const auto x2 = torch::randn({1, 2}), t2 = torch::randn({1, 2});
  std::vector<double> sums(b.task->sumCount(), 0.0);
  b.task->forwardEvalSums(*b.model, x1, t1, Autocast{}, sums);
  b.task->forwardEvalSums(*b.model, x2, t2, Autocast{}, sums);
  const auto mae = [](const at::Tensor& x, const at::Tensor& t) {
    return (x * torch::tensor({1.0f, 2.0f}) - t).abs().mean().item<double>();
  };
  EXPECT_NEAR(sums[0], expectedLoss(x1, t1).sum().item<double>() + expectedLoss(x2, t2).sum().item<double>(), 1e-5);
  EXPECT_NEAR(sums[1], 3 * mae(x1, t1) + mae(x2, t2), 1e-5);
  const auto m = b.task->metrics({0.5, 0.25}, 2);
  EXPECT_EQ(b.task->best().name, "loss");
  EXPECT_FALSE(b.task->best().higher_is_better);
  EXPECT_EQ(b.task->describe(m), "eval loss 0.25, mae 0.125");
  EXPECT_EQ(b.task->epochFigures(m), "eval_mae 0.125");
}

// A mean is the batch's sum (mean x n) where every sample weighs 1, and refused
// where padding weighs 0: at set-up when the plan pads, and in a padded batch.
TEST(ModuleLoss, AMeanIsTheSumWithoutPaddingAndRefusedWithIt) {
  const batchdist::testsupport::ScratchDir dir("module_mean");
  const auto path = scriptFile(dir.string(), "mean", kMean);
  const std::string refused =
      "model.path: " + path + ": forward(x, target) returned the batch's mean loss (a 0-d "
      "tensor), which cannot leave out the padding of batch.last_batch: pad (samples of weight "
      "0); return one loss per sample instead, a [N] tensor (reduction='none', e.g. "
      "F.mse_loss(out, target, reduction='none').mean(1)), or use batch.last_batch: drop";
  EXPECT_EQ(errorOf([&] { build(path, trainSet(), /*padded=*/true); }), refused);
  auto b = build(path, trainSet());
  const auto x = torch::randn({4, 2}), t = torch::randn({4, 2});
  const auto sum = b.task->forwardLoss(*b.model, Batch{x, t, torch::ones({4})}, Autocast{});
  EXPECT_NEAR(sum.item<double>(), expectedLoss(x, t).sum().item<double>(), 1e-5);
  EXPECT_EQ(errorOf([&] { b.task->forwardLoss(*b.model, Batch{x, t, torch::tensor({1.0f, 1.0f, 0.0f, 0.0f})}, Autocast{}); }),
            refused);
}

TEST(ModuleLoss, ABrokenContractIsNamed) {
  const batchdist::testsupport::ScratchDir dir("module_broken");
  const auto d = dir.string();
  const auto train = trainSet();
  const auto probeError = [&](const std::string& name, const std::string& source) {
    const auto path = scriptFile(d, name, source);
    return std::make_pair(path, errorOf([&] { build(path, train); }));
  };
  auto [shape, e1] = probeError("shape", "def forward(self, x, target):\n    return x * self.w - target\n");
  EXPECT_EQ(e1, "model.path: " + shape + ": forward(x, target) returned a loss of shape [2, 2] for "
                "a batch of 2 samples; return one loss per sample, shape [2] (reduction='none', "
                "then a mean over all but the first dimension)");
  auto [no_loss, e2] = probeError("no_loss", "def forward(self, x, target):\n    return {\"mse\": (x - target).mean(1)}\n");
  EXPECT_EQ(e2, "model.path: " + no_loss + ": forward(x, target) returned a dict without a \"loss\" "
                "entry; put the per-sample loss under \"loss\"");
  auto [name, e3] = probeError("name", "def forward(self, x, target):\n    return {\"loss\": (x - target).mean(1), \"my mae\": x.mean()}\n");
  EXPECT_EQ(e3, "model.path: " + name + ": forward(x, target) returned a metric named 'my mae'; "
                "name metrics with a letter, then letters, digits, '_', '-' or '.'");
  auto [ints, e4] = probeError("ints", "def forward(self, x, target):\n    return target.argmax(1)\n");
  EXPECT_EQ(e4, "model.path: " + ints + ": forward(x, target) returned a loss that is not a "
                "floating tensor (Tensor of Long); return one loss per sample, a float [N] tensor");
  auto [fails, e5] = probeError("fails", "def forward(self, x, target):\n    return x[10]\n");
  EXPECT_NE(e5.find("model " + fails + ": forward(x, target) failed on x of shape [2, 2] and "
                    "target of shape [2, 2]: "), std::string::npos) << e5;
  EXPECT_NE(e5.find("(a sample batch: inputs of zeros, the first training targets)"), std::string::npos) << e5;
}

// Note [module loss]: npy's targets pass as they are for a module's own loss (any
// shape, integers not labels); every other task keeps its rules.
TEST(ModuleLoss, NpyTargetsOfAnyShapePassAsTheyAre) {
  namespace t = batchdist::testing;
  const batchdist::testsupport::ScratchDir dir("module_npy");
  const auto d = dir.string();
  const auto bytes = [](const at::Tensor& x) {
    return std::string(static_cast<const char*>(x.data_ptr()), x.numel() * x.element_size());
  };
  const auto x = torch::arange(40, torch::kFloat).reshape({10, 4});
  t::writeFile(d + "/x.npy", t::makeNpy(NpyType::kFloat32, {10, 4}, bytes(x)));
  const auto y3 = torch::arange(40, torch::kFloat).reshape({10, 2, 2});
  t::writeFile(d + "/y.npy", t::makeNpy(NpyType::kFloat32, {10, 2, 2}, bytes(y3)));
  DataConfig cfg;
  cfg.name = DataName::kNpy;
  cfg.path = d;
  cfg.val_fraction = 0.2;
  DataContext own;
  own.module_targets = true;
  auto split = loadData(cfg, 1, "", own);
  EXPECT_EQ(split.train.target.scalar_type(), torch::kFloat);
  EXPECT_EQ(split.train.target.sizes(), (std::vector<int64_t>{8, 2, 2}));
  EXPECT_EQ(split.train.classes, 0);
  EXPECT_EQ(errorOf([&] { loadData(cfg, 1, ""); }),
            d + "/y.npy: expected N float targets or N x k, got shape [10, 2, 2]");
  // Integers of any shape and value (token ids, say), not class labels.
  const auto ids = torch::arange(30, torch::kLong).reshape({10, 3}) * (int64_t{1} << 30);
  t::writeFile(d + "/y.npy", t::makeNpy(NpyType::kInt64, {10, 3}, bytes(ids)));
  split = loadData(cfg, 1, "", own);
  EXPECT_EQ(split.train.target.scalar_type(), torch::kLong);
  EXPECT_EQ(split.train.target.sizes(), (std::vector<int64_t>{8, 3}));
  EXPECT_GT(split.train.target.max().item<int64_t>(), int64_t{1} << 24);  // no label range
  EXPECT_NE(errorOf([&] { loadData(cfg, 1, ""); }).find("expected a 1-D array of N labels"), std::string::npos);
  // The validation targets must be like the training ones.
  t::writeFile(d + "/val_x.npy", t::makeNpy(NpyType::kFloat32, {10, 4}, bytes(x)));
  t::writeFile(d + "/val_y.npy", t::makeNpy(NpyType::kFloat32, {10, 2, 2}, bytes(y3)));
  EXPECT_EQ(errorOf([&] { loadData(cfg, 1, "", own); }),
            d + "/val_y.npy: float targets of shape [2, 2] per sample, but y.npy has integer "
                "targets of shape [3] per sample; give both alike");
}
