// Note [program parts], Note [program data]: a program's own module, loss
// function and data set as the trainer sees them: the model (its state restored
// at every build, its BatchNorm seen, its signature for the search cache), the
// task (module_loss: per-sample losses weighed, metrics named, a mean refused
// under padding, a broken contract named), the data (whole tensors or an
// ExampleSource read through the loader and the evaluator's path, split by
// data.val_fraction), and the command refusing `program` without a program.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/config_errors.h"
#include "worker/data/data.h"
#include "worker/data/loader.h"
#include "worker/model/model.h"
#include "worker/model/program_model.h"
#include "worker/run.h"
#include "worker/task/task.h"

using namespace batchdist::worker;
using batchdist::testsupport::errorOf;

namespace {

/// Linear 2 -> 2 whose loss is the per-sample squared error, and its mae metric.
std::shared_ptr<ProgramModule> linearProgram(ProgramModule::LossFunction loss = {}) {
  torch::manual_seed(1);
  auto lin = torch::nn::Linear(2, 2);
  if (!loss) {
    loss = [](torch::nn::Module& m, const at::Tensor& x, const at::Tensor& t) {
      const auto err = dynamic_cast<torch::nn::LinearImpl&>(m).forward(x) - t;
      return ProgramLoss{err.square().mean(1), {{"mae", err.abs().mean()}}};
    };
  }
  return std::make_shared<ProgramModule>(lin.ptr(), std::move(loss));
}

/// Examples i: x = [i, -i], target = [2i, 0]; counts the calls of get().
class CountingSource final : public ExampleSource {
 public:
  explicit CountingSource(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  std::pair<at::Tensor, at::Tensor> get(const std::vector<int64_t>& indices) const override {
    ++calls;
    auto i = torch::tensor(indices, torch::kFloat).unsqueeze(1);
    return {torch::cat({i, -i}, 1), torch::cat({2 * i, torch::zeros_like(i)}, 1)};
  }
  mutable std::atomic<int> calls{0};

 private:
  int64_t n_;
};

DataConfig programData(std::shared_ptr<const ProgramData> p, double val_fraction = 0.2) {
  DataConfig c;
  c.name = DataName::kProgram;
  c.val_fraction = val_fraction;
  c.program = std::move(p);
  return c;
}

}  // namespace

TEST(ProgramModel, EachBuildStartsFromTheStateHandedOverAndNamesTheModule) {
  auto program = linearProgram();
  const auto handed = program->module()->parameters()[0].clone();
  ModelConfig mc;
  mc.name = ModelName::kProgram;
  mc.program = program;
  auto model = buildModel(mc, {2}, 0);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.add_(1.0);  // a search's trial steps
  }
  EXPECT_FALSE(model->parameters()[0].equal(handed));
  auto again = buildModel(mc, {2}, 0);
  EXPECT_TRUE(again->parameters()[0].equal(handed));
  EXPECT_TRUE(again->takesTarget());
  EXPECT_FALSE(again->hasBatchNorm());
  EXPECT_EQ(again->describe(), "torch::nn::LinearImpl (the program's module), 0.00 M parameters");
  EXPECT_EQ(program->signature(), "torch::nn::LinearImpl weight[2, 2] bias[2]");
  EXPECT_FALSE(again->setRecompute(true));  // no blocks batchdist knows
  // The command has no program to hand over.
  mc.program = nullptr;
  EXPECT_EQ(errorOf([&] { buildModel(mc, {2}, 0); }),
            "model.name: program names the module that a program hands to batchdist's library "
            "(batchdist::Job::train: docs/library.md); the batchdist command cannot take one");
  auto bn = std::make_shared<ProgramModule>(
      torch::nn::Sequential(torch::nn::Linear(2, 4), torch::nn::BatchNorm1d(4)).ptr(),
      [](torch::nn::Module&, const at::Tensor& x, const at::Tensor&) { return ProgramLoss{x.sum(1), {}}; });
  EXPECT_TRUE(programHasBatchNorm(*bn));
}

TEST(ProgramModel, TheLossFunctionIsTheTaskAndItsContractIsNamed) {
  auto program = linearProgram();
  ModelConfig mc;
  mc.name = ModelName::kProgram;
  mc.program = program;
  auto model = buildModel(mc, {2}, 0);
  Dataset train;
  train.x = torch::randn({5, 2});
  train.target = torch::randn({5, 2});
  train.sample_shape = {2};
  train.as_given = true;
  auto task = makeTask(TaskKind::kModuleLoss, "");
  task->probe(*model, train, {2}, Autocast{}, /*padded=*/true);
  ASSERT_EQ(task->sumCount(), 2);
  EXPECT_EQ(task->metrics({1.0, 0.5}, 2.0).at(1).name, "mae");
  // Weighed per sample: padding (weight 0) adds nothing.
  Batch b{train.x, train.target, torch::tensor({1.0f, 1.0f, 0.0f, 1.0f, 0.0f})};
  const auto expected = ((dynamic_cast<torch::nn::LinearImpl&>(*program->module()).forward(train.x) -
                          train.target).square().mean(1) * b.w).sum();
  EXPECT_NEAR(task->forwardLoss(*model, b, Autocast{}).item<double>(), expected.item<double>(), 1e-6);

  const auto probeError = [&](ProgramModule::LossFunction loss, bool padded = false) {
    ModelConfig c;
    c.name = ModelName::kProgram;
    c.program = linearProgram(std::move(loss));
    auto m = buildModel(c, {2}, 0);
    return errorOf([&] { makeTask(TaskKind::kModuleLoss, "")->probe(*m, train, {2}, Autocast{}, padded); });
  };
  EXPECT_EQ(probeError([](torch::nn::Module&, const at::Tensor& x, const at::Tensor&) {
              return ProgramLoss{x.square().mean(), {}};
            }, /*padded=*/true),
            "the loss function returned the batch's mean loss (a 0-d tensor), which cannot leave "
            "out the padding of batch.last_batch: pad (samples of weight 0); return one loss per "
            "sample instead, a [N] tensor (reduction='none', e.g. F.mse_loss(out, target, "
            "reduction='none').mean(1)), or use batch.last_batch: drop");
  EXPECT_EQ(probeError([](torch::nn::Module&, const at::Tensor& x, const at::Tensor&) {
              return ProgramLoss{x.sum(1), {{"per_sample", x.sum(1)}}};
            }),
            "the loss function returned the metric 'per_sample' as a tensor of shape [2]; return "
            "the batch's mean, a 0-d tensor (the first training samples)");
  EXPECT_EQ(probeError([](torch::nn::Module&, const at::Tensor& x, const at::Tensor&) {
              return ProgramLoss{x, {}};
            }),
            "the loss function returned a loss of shape [2, 2] for a batch of 2 samples; return "
            "one loss per sample, shape [2] (reduction='none', then a mean over all but the first "
            "dimension)");
  const auto failed = probeError([](torch::nn::Module&, const at::Tensor& x, const at::Tensor&) {
    return ProgramLoss{x.matmul(torch::ones({3, 1})), {}};
  });
  EXPECT_EQ(failed.rfind("the loss function failed on x of shape [2, 2] and target of shape [2, 2]: ", 0), 0u)
      << failed;
  EXPECT_NE(failed.find("(the first training samples)"), std::string::npos) << failed;
  EXPECT_EQ(failed.find("Exception raised from"), std::string::npos) << failed;  // no backtrace
}

TEST(ProgramData, AnExampleSourceIsSplitAndReadAMicroBatchAtATime) {
  auto source = std::make_shared<CountingSource>(20);
  auto p = std::make_shared<ProgramData>();
  p->train.source = source;
  const auto split = loadData(programData(p, 0.2), 7, "");
  ASSERT_EQ(split.train.size(), 16);
  ASSERT_EQ(split.val.size(), 4);
  EXPECT_EQ(split.train.sample_shape, std::vector<int64_t>{2});
  // Training and validation hold every example once.
  std::vector<int64_t> all;
  for (const auto* d : {&split.train, &split.val}) {
    std::vector<int64_t> idx(static_cast<std::size_t>(d->size()));
    for (int64_t i = 0; i < d->size(); ++i) idx[static_cast<std::size_t>(i)] = i;
    const auto [x, t] = d->batch(idx);
    EXPECT_TRUE(t.select(1, 0).equal(2 * x.select(1, 0)));  // x and target of the same example
    for (int64_t i = 0; i < x.size(0); ++i) all.push_back(static_cast<int64_t>(x[i][0].item<float>()));
  }
  std::sort(all.begin(), all.end());
  for (int64_t i = 0; i < 20; ++i) EXPECT_EQ(all[static_cast<std::size_t>(i)], i);
  // The loader reads one micro-batch with one get(), as given (float here, any dtype).
  LoaderOptions lo;
  Loader loader(split.train, lo);
  MicroBatch job;
  job.indices = {3, 0, 5};
  job.weights = {1.0f, 1.0f, 0.0f};
  const int before = source->calls.load();
  loader.start({job}, 0);
  const auto b = loader.next();
  EXPECT_EQ(source->calls.load() - before, 1);
  const auto [x, t] = split.train.batch({3, 0, 5});
  EXPECT_TRUE(b.x.equal(x));
  EXPECT_TRUE(b.target.equal(t));
  EXPECT_TRUE(b.w.equal(torch::tensor({1.0f, 1.0f, 0.0f})));
}

TEST(ProgramData, WholeTensorsPassAsGivenAndBadPartsAreNamed) {
  auto p = std::make_shared<ProgramData>();
  p->train.x = torch::arange(10, torch::kLong).reshape({5, 2});  // token ids: kept int64
  p->train.target = torch::arange(5, torch::kLong);
  p->val.x = torch::zeros({3, 2}, torch::kLong);
  p->val.target = torch::zeros({3}, torch::kLong);
  const auto split = loadData(programData(p), 7, "");
  EXPECT_EQ(split.train.size(), 5);  // a validation set given: nothing held out
  EXPECT_EQ(split.val.size(), 3);
  EXPECT_EQ(split.train.inputs(torch::tensor({1, 4}, torch::kLong)).scalar_type(), torch::kLong);
  EXPECT_TRUE(split.train.inputs(torch::tensor({1}, torch::kLong)).equal(torch::tensor({{2, 3}}, torch::kLong)));

  p->val.target = torch::zeros({4}, torch::kLong);
  EXPECT_EQ(errorOf([&] { loadData(programData(p), 7, ""); }),
            "data.name: program: the validation tensors hold x of shape [3, 2] and target of "
            "shape [4]; both need the samples first, as many of each");
  EXPECT_EQ(errorOf([&] { loadData(programData(nullptr), 7, ""); }),
            "data.name: program names the data set that a program hands to batchdist's library "
            "(batchdist::Job::train: docs/library.md); the batchdist command cannot take one");
  class Short final : public ExampleSource {
   public:
    int64_t size() const override { return 8; }
    std::pair<at::Tensor, at::Tensor> get(const std::vector<int64_t>&) const override {
      return {torch::zeros({1, 2}), torch::zeros({1})};
    }
  };
  auto q = std::make_shared<ProgramData>();
  q->train.source = std::make_shared<Short>();
  EXPECT_EQ(errorOf([&] { loadData(programData(q, 0.0), 7, "").train.batch({0, 1}); }),
            "data.name: program: the data set's get() of 2 indices returned x of shape [1, 2] "
            "and target of shape [1]; return both stacked, [2, ...]");
}

TEST(ProgramParts, TheCommandRefusesProgramWithoutOne) {
  RunRequest req;
  req.sets = {"model.name=program"};
  EXPECT_EQ(errorOf([&] { loadRunConfig(req); }),
            "model.name: program names the module that a program hands to batchdist's library "
            "(batchdist::Job::train: docs/library.md); the batchdist command cannot take one");
  req.sets = {"data.name=program"};
  EXPECT_EQ(errorOf([&] { loadRunConfig(req); }),
            "data.name: program names the data set that a program hands to batchdist's library "
            "(batchdist::Job::train: docs/library.md); the batchdist command cannot take one");
  // With the parts, the task is the module's own loss, whatever the data.
  req.sets = {"model.name=program", "data.name=program", "task.name=classification"};
  req.program_module = linearProgram();
  auto p = std::make_shared<ProgramData>();
  p->train.x = torch::randn({6, 2});
  p->train.target = torch::randn({6, 2});
  req.program_data = p;
  const auto cfg = loadRunConfig(req);
  EXPECT_EQ(errorOf([&] { chooseTask(cfg, loadData(cfg.data, 1, "")); }),
            "the program's settings: task.name: classification, but the program's module trains with the loss "
            "function it was handed over with; leave task.name out (or module_loss)");
  req.sets.pop_back();
  const auto ok = loadRunConfig(req);
  EXPECT_EQ(chooseTask(ok, loadData(ok.data, 1, "")).kind, TaskKind::kModuleLoss);
}
