// Note [task]: the tasks' losses and metrics on small tensors with known answers,
// Note [task choice] (which task, which head, and the errors), and the checkpoint
// history's metrics in both formats.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "common/error.h"
#include "tests/image_fixtures.h"
#include "tests/scratch_dir.h"
#include "worker/data/data.h"
#include "worker/data/sources/npy.h"
#include "worker/task/task.h"
#include "worker/train/checkpoint/checkpoint.h"

using namespace batchdist::worker;

namespace {

std::string chooseError(const Config& cfg, const DataSplit& data) {
  try {
    chooseTask(cfg, data);
  } catch (const batchdist::ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

DataSplit withTargets(const at::Tensor& target, int64_t classes = 0) {
  DataSplit d;
  d.train.target = target;
  d.train.classes = classes;
  return d;
}

}  // namespace

TEST(Task, ClassificationIsCrossEntropyAndArgmaxAccuracy) {
  const auto task = makeTask(TaskKind::kClassification);
  const auto out = torch::tensor({{2.0f, 0.0f, 0.0f}, {0.0f, 1.0f, 3.0f}, {1.0f, 1.0f, 0.0f}});
  const auto y = torch::tensor({0, 1, 1}, torch::kLong);
  const auto loss = task->perSampleLoss(out.to(torch::kBFloat16), y);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::allclose(task->perSampleLoss(out, y),
                              torch::nn::functional::cross_entropy(
                                  out, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone))));
  std::vector<double> sums(task->sumCount(), 0.0);
  task->addEvalSums(out, y, sums);
  task->addEvalSums(out.slice(0, 0, 1), y.slice(0, 0, 1), sums);  // sums add up over batches
  EXPECT_NEAR(sums[0], task->perSampleLoss(out, y).sum().item<double>() + task->perSampleLoss(out, y)[0].item<double>(), 1e-5);
  // argmax: row 0 -> 0 (right), row 1 -> 2 (wrong), row 2 -> 0 (tie, first: wrong), row 0 again right.
  const auto m = task->metrics(sums, 4);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].name, "accuracy");
  EXPECT_DOUBLE_EQ(m[0].value, 0.5);
  EXPECT_EQ(task->best().name, "accuracy");
  EXPECT_TRUE(task->best().higher_is_better);
  EXPECT_EQ(task->describe(m), "eval accuracy 50.00 %");
  EXPECT_EQ(task->epochFigures(m), "eval_acc 50.00 %");
}

TEST(Task, RegressionIsTheMeanSquaredErrorPerSampleWithMseAndMae) {
  const auto task = makeTask(TaskKind::kRegression);
  // N x 2 targets: sample 0 off by (1, 3), sample 1 exact.
  const auto out = torch::tensor({{1.0f, 3.0f}, {5.0f, 6.0f}});
  const auto y = torch::tensor({{0.0f, 0.0f}, {5.0f, 6.0f}});
  EXPECT_TRUE(torch::equal(task->perSampleLoss(out, y), torch::tensor({5.0f, 0.0f})));  // (1 + 9) / 2
  std::vector<double> sums(task->sumCount(), 0.0);
  task->addEvalSums(out, y, sums);
  const auto m = task->metrics(sums, 2);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].name, "mse");
  EXPECT_DOUBLE_EQ(m[0].value, 2.5);
  EXPECT_EQ(m[1].name, "mae");
  EXPECT_DOUBLE_EQ(m[1].value, 1.0);  // (1 + 3) / 2 for sample 0, 0 for sample 1, over 2
  EXPECT_DOUBLE_EQ(sums[0] / 2, 2.5);  // the eval loss is the mse
  EXPECT_EQ(task->best().name, "mse");
  EXPECT_FALSE(task->best().higher_is_better);
  EXPECT_EQ(task->describe(m), "eval mse 2.5, eval mae 1");
  // N targets (1-D) against an N x 1 head.
  EXPECT_TRUE(torch::equal(task->perSampleLoss(torch::tensor({{2.0f}, {1.0f}}), torch::tensor({0.0f, 1.0f})),
                           torch::tensor({4.0f, 0.0f})));
}

TEST(Task, AutoFollowsTheTargetsAndTheHeadFitsThem) {
  auto cfg = parseConfig("data: {name: npy, path: d}", "t.yaml");
  auto c = chooseTask(cfg, withTargets(torch::zeros({6, 3})));
  EXPECT_EQ(c.kind, TaskKind::kRegression);
  EXPECT_EQ(c.outputs, 3);
  EXPECT_EQ(c.why, "task.name: auto; npy has float targets");
  EXPECT_EQ(chooseTask(cfg, withTargets(torch::zeros({6}))).outputs, 1);
  c = chooseTask(cfg, withTargets(torch::zeros({6}, torch::kLong), 4));
  EXPECT_EQ(c.kind, TaskKind::kClassification);
  EXPECT_EQ(c.outputs, 4);
  EXPECT_EQ(c.why, "task.name: auto; npy has class labels");
  cfg = parseConfig("data: {name: npy, path: d}\nmodel: {outputs: 6}", "t.yaml");
  EXPECT_EQ(chooseTask(cfg, withTargets(torch::zeros({6}, torch::kLong), 4)).outputs, 6);
}

TEST(Task, ATaskOrHeadThatDoesNotFitTheTargetsIsNamed) {
  const auto floats = withTargets(torch::zeros({6, 3}));
  const auto labels = withTargets(torch::zeros({6}, torch::kLong), 4);
  EXPECT_EQ(chooseError(parseConfig("task: {name: regression}\ndata: {name: npy, path: d}", "t.yaml"), labels),
            "t.yaml: task.name: regression needs float targets, but data.name npy gives class labels "
            "(regression reads data.name: npy with a float32 or float64 y.npy)");
  EXPECT_EQ(chooseError(parseConfig("task: {name: classification}\ndata: {name: npy, path: d}", "t.yaml"), floats),
            "t.yaml: task.name: classification needs integer class labels, but npy's y.npy holds floats; use "
            "task.name: regression (or auto), or integer labels");
  EXPECT_EQ(chooseError(parseConfig("model: {outputs: 2}\ndata: {name: npy, path: d}", "t.yaml"), floats),
            "t.yaml: model.outputs: 2, but the targets have 3 values per sample; one output per value (leave "
            "it out for 3)");
  EXPECT_EQ(chooseError(parseConfig("model: {outputs: 3}\ndata: {name: npy, path: d}", "t.yaml"), labels),
            "t.yaml: model.outputs: 3 is below the 4 classes of the data; one output per class (leave it out "
            "for exactly 4)");
  try {
    parseConfig("task: {name: ranking}", "t.yaml");
    FAIL();
  } catch (const batchdist::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("task.name"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("classification"), std::string::npos) << e.what();
  }
}

// Note [task]: the checkpoint's history keeps the task's metrics by name (format
// 3); format 2's positional epochs (classification's accuracy) are still read.
TEST(Task, CheckpointHistoryReadsKeyedMetricsAndTheOldPositionalAccuracy) {
  CheckpointManifest base;
  base.rng.emplace();
  base.step = 8;
  base.samples = 96;
  auto m = manifestJson(base);
  m["history"] = nlohmann::ordered_json::array();
  m["history"].push_back({0, 1.5, 1.25, 0.75, 1000.0, 2.0});
  auto p = positionOf(readManifest(m));
  ASSERT_EQ(p.history.size(), 1u);
  EXPECT_DOUBLE_EQ(p.history[0].eval_loss, 1.25);
  ASSERT_EQ(p.history[0].eval_metrics.size(), 1u);
  EXPECT_EQ(p.history[0].eval_metrics[0].name, "accuracy");
  EXPECT_DOUBLE_EQ(p.history[0].eval_metrics[0].value, 0.75);
  EXPECT_DOUBLE_EQ(p.history[0].seconds, 2.0);
  m["history"] = nlohmann::ordered_json::array();
  m["history"].push_back({{"epoch", 0}, {"train_loss", 0.5}, {"eval_loss", 0.25},
                          {"eval", {{"mse", 0.25}, {"mae", 0.4}}}, {"samples_per_s", 10.0},
                          {"seconds", 3.0}, {"noise_scale", 7.0}});
  p = positionOf(readManifest(m));
  ASSERT_EQ(p.history[0].eval_metrics.size(), 2u);
  EXPECT_EQ(p.history[0].eval_metrics[1].name, "mae");
  EXPECT_DOUBLE_EQ(metricValue(p.history[0].eval_metrics, "mse"), 0.25);
  EXPECT_DOUBLE_EQ(p.history[0].noise_scale, 7.0);
}

// Note [task choice]: npy's y.npy as float targets (float32 or float64, N or N x k),
// and the ways they can be wrong.
TEST(Task, NpyFloatTargetsLoadAndBadOnesAreNamed) {
  namespace t = batchdist::testing;
  const batchdist::testsupport::ScratchDir dir("task_npy");
  const auto d = dir.string();
  const auto bytes = [](const at::Tensor& x) {
    return std::string(static_cast<const char*>(x.data_ptr()), x.numel() * x.element_size());
  };
  const auto x = torch::arange(40, torch::kFloat).reshape({10, 4});
  const auto y = torch::arange(20, torch::kDouble).reshape({10, 2}) / 4;
  t::writeFile(d + "/x.npy", t::makeNpy(NpyType::kFloat32, {10, 4}, bytes(x)));
  t::writeFile(d + "/y.npy", t::makeNpy(NpyType::kFloat64, {10, 2}, bytes(y)));
  DataConfig cfg;
  cfg.name = DataName::kNpy;
  cfg.path = d;
  cfg.val_fraction = 0.2;
  const auto split = loadData(cfg, 1, "");
  EXPECT_EQ(split.train.target.scalar_type(), torch::kFloat);
  EXPECT_EQ(split.train.target.sizes(), (std::vector<int64_t>{8, 2}));
  EXPECT_EQ(split.train.classes, 0);
  const auto loadError = [&] {
    try {
      loadData(cfg, 1, "");
    } catch (const batchdist::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  auto nan = y.clone();
  nan[6][1] = std::nan("");
  t::writeFile(d + "/y.npy", t::makeNpy(NpyType::kFloat64, {10, 2}, bytes(nan)));
  EXPECT_EQ(loadError(), d + "/y.npy: target of sample 6 is not finite (NaN or inf)");
  const auto y3 = torch::zeros({10, 2, 2}, torch::kFloat);
  t::writeFile(d + "/y.npy", t::makeNpy(NpyType::kFloat32, {10, 2, 2}, bytes(y3)));
  EXPECT_EQ(loadError(), d + "/y.npy: expected N float targets or N x k, got shape [10, 2, 2]");
  // A validation pair whose targets are not like the training ones.
  t::writeFile(d + "/y.npy", t::makeNpy(NpyType::kFloat64, {10, 2}, bytes(y)));
  t::writeFile(d + "/val_x.npy", t::makeNpy(NpyType::kFloat32, {10, 4}, bytes(x)));
  t::writeFile(d + "/val_y.npy", t::makeNpy(NpyType::kFloat32, {10}, bytes(y.to(torch::kFloat).select(1, 0).contiguous())));
  EXPECT_EQ(loadError(), d + "/val_y.npy: 1 float target per sample, but y.npy has 2 float targets per sample; give both alike");
}
