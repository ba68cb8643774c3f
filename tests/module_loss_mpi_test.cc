// Note [loss normalisation] for a TorchScript module's own loss (Note [module loss]):
// the same global batch split as (W=1, a=P), ..., (W=P, a=1) over real ranks gives
// the same weights: the per-sample loss of tests/data/regression_loss.pt with a
// padded last batch (whose padding weighs 0: the same weights as keep's short last
// batch of the same real samples), and the mean of tests/data/mean_loss.pt (taken
// as the sum) under keep's uneven micro-batches. The mean is refused on every rank
// when the plan pads. The targets are y.npy of N x 1 x 3, a shape only a module's
// own loss takes (DataContext::module_targets).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>

#include "common/error.h"
#include "mpi_helpers.h"
#include "split_invariance.h"
#include "tests/image_fixtures.h"
#include "tests/scratch_dir.h"
#include "worker/data/sources/npy.h"
#include "worker/model/program_model.h"
#include "worker/task/task.h"
#include "worker/train/step/step_engine.h"

using namespace batchdist;
using namespace batchdist::worker;

namespace {

constexpr int64_t kSamples = 421;

/// x.npy (421 x 24) and y.npy (421 x 1 x 3, a linear function of x plus noise),
/// seeded: the same bytes in every rank's own directory.
void writeArrays(const std::string& dir) {
  auto gen = at::detail::createCPUGenerator(17);
  const auto x = at::rand({kSamples, 24}, gen, torch::kFloat);
  const auto w = at::randn({24, 3}, gen, torch::kFloat);
  const auto y = (x.matmul(w) + 0.01 * at::randn({kSamples, 3}, gen, torch::kFloat)).contiguous();
  const auto bytes = [](const at::Tensor& t) {
    return std::string(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  };
  batchdist::testing::writeFile(dir + "/x.npy", batchdist::testing::makeNpy(NpyType::kFloat32, {kSamples, 24}, bytes(x)));
  batchdist::testing::writeFile(dir + "/y.npy", batchdist::testing::makeNpy(NpyType::kFloat32, {kSamples, 1, 3}, bytes(y)));
}

Config moduleConfig(const std::string& dir, const std::string& module, int64_t global,
                    const std::string& policy) {
  return parseConfig(
      "model: {name: torchscript, path: " BATCHDIST_SOURCE_DIR "/tests/data/" + module + "}\n"
      "data: {name: npy, path: " + dir + ", val_fraction: 0.1}\n"
      "batch: {global: " + std::to_string(global) + ", per_gpu: 16, last_batch: " + policy + "}\n"
      "optim: {name: sgd, lr: 0.1, base_batch: " + std::to_string(global) +
          ", momentum: 0.9, warmup_steps: 2}\n"
      "train: {epochs: 3, seed: 3}\n",
      "module.yaml");
}

DataSplit loadFor(const Config& cfg) {
  DataContext ctx;
  ctx.module_targets = trainsModuleLoss(cfg);  // as prepareData does
  return loadData(cfg.data, cfg.train.seed, "", ctx);
}

/// Rank 0's parameters after 30 steps, for every world size W dividing P (a = P / W),
/// in `dir`'s arrays (on rank 0; empty elsewhere).
std::map<int, torch::Tensor> weightsPerSplit(const std::string& dir, const std::string& module,
                                             const std::string& policy) {
  const int64_t G = 16 * mpitest::worldSize();
  const auto cfg = moduleConfig(dir, module, G, policy);
  // The test needs a short last batch: padded (pad) or split unevenly (keep).
  const auto data = loadFor(cfg);
  EXPECT_EQ(data.train.target.dim(), 3);  // N x 1 x 3: a shape only a module's own loss takes
  const auto train = data.train.size();
  EXPECT_NE(train % G, 0) << train << " training samples, G " << G;
  // 30 steps cross an epoch boundary and its short last batch (12 steps per epoch at G 32).
  return testsupport::weightsForEverySplit(cfg, 30, "gloo", loadFor, [](StepEngine& trainer) {
    EXPECT_EQ(trainer.task().kind(), TaskKind::kModuleLoss);
  });
}

double maxDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

/// Rank 0: the weights of every split equal W=1's.
void expectSameForEverySplit(const std::map<int, torch::Tensor>& weights, const std::string& what) {
  testsupport::expectSameAsOneRank(weights, 1e-5, what + " m=16", 16 * mpitest::worldSize());
}

}  // namespace

TEST(ModuleLossInvariance, PerSampleLossWithPadding) {
  const testsupport::ScratchDir dir("module_invariance");
  writeArrays(dir.string());
  const auto pad = weightsPerSplit(dir.string(), "regression_loss.pt", "pad");
  const auto keep = weightsPerSplit(dir.string(), "regression_loss.pt", "keep");
  if (mpitest::worldRank() != 0) return;
  expectSameForEverySplit(pad, "regression_loss.pt sgd/pad");
  // Padding weighs 0: the padded last batch trains as keep's short one, which
  // holds the same real samples (one permutation per epoch) and nothing else.
  const int P = mpitest::worldSize();
  const double diff = maxDiff(pad.at(P), keep.at(1));
  EXPECT_LT(diff, 1e-5) << "pad W=" << P << " vs keep W=1: max |dw| " << diff;
  std::printf("[ invariance ] regression_loss.pt pad W=%d vs keep W=1: max |dw| = %.3g\n", P, diff);
}

// A mean is taken as the batch's sum: keep's uneven micro-batches weigh alike.
TEST(ModuleLossInvariance, MeanLossUnderKeep) {
  const testsupport::ScratchDir dir("module_invariance_mean");
  writeArrays(dir.string());
  const auto keep = weightsPerSplit(dir.string(), "mean_loss.pt", "keep");
  if (mpitest::worldRank() == 0) expectSameForEverySplit(keep, "mean_loss.pt sgd/keep");
}

// Every rank refuses the mean at set-up, before any collective: nothing waits.
TEST(ModuleLossInvariance, MeanLossRefusedOnEveryRankWhenThePlanPads) {
  const testsupport::ScratchDir dir("module_mean_pad");
  writeArrays(dir.string());
  const int P = mpitest::worldSize();
  const auto cfg = moduleConfig(dir.string(), "mean_loss.pt", 16 * P, "pad");
  mpitest::inGroup(P, [&](collective::Communicator& comm) {
    const auto data = loadFor(cfg);
    const auto plan = makePlan(cfg, comm.size(), data.train.size(), false);
    ASSERT_GT(plan.samples_padded, 0);
    std::string error = "(no error)";
    try {
      StepEngine trainer(cfg, comm, data, at::kCPU, plan);
    } catch (const ConfigError& e) {
      error = e.what();
    }
    EXPECT_EQ(error, "model.path: " BATCHDIST_SOURCE_DIR "/tests/data/mean_loss.pt: forward(x, "
                     "target) returned the batch's mean loss (a 0-d tensor), which cannot leave "
                     "out the padding of batch.last_batch: pad (samples of weight 0); return one "
                     "loss per sample instead, a [N] tensor (reduction='none', e.g. "
                     "F.mse_loss(out, target, reduction='none').mean(1)), or use "
                     "batch.last_batch: drop");
  });
}

// Note [program parts]: a program's C++ module and loss function on its own data
// set (an ExampleSource read by index, Note [program data]) train like a
// TorchScript module's own loss: the same global batch over (W=1, a=P) ... (W=P,
// a=1) real ranks, a padded last batch, gives the same weights; the metric the
// loss function names reaches the task. Every split starts from the module's
// state as handed over, though the same module object trained the split before.
namespace {

/// The arrays of writeArrays(), read an example at a time as a program's data set would.
class ArraysSource final : public ExampleSource {
 public:
  ArraysSource(at::Tensor x, at::Tensor y) : x_(std::move(x)), y_(std::move(y)) {}
  int64_t size() const override { return x_.size(0); }
  std::pair<at::Tensor, at::Tensor> get(const std::vector<int64_t>& indices) const override {
    std::vector<at::Tensor> xs, ys;
    for (const int64_t i : indices) {
      xs.push_back(x_[i]);
      ys.push_back(y_[i]);
    }
    return {at::stack(xs), at::stack(ys)};
  }

 private:
  at::Tensor x_, y_;
};

}  // namespace

TEST(ProgramInvariance, AProgramsModuleLossAndDataTrainAlikeOnEverySplit) {
  const int P = mpitest::worldSize();
  const int64_t G = 16 * P;
  auto gen = at::detail::createCPUGenerator(17);
  const auto x = at::rand({kSamples, 24}, gen, torch::kFloat);
  const auto y = (x.matmul(at::randn({24, 3}, gen, torch::kFloat)) +
                  0.01 * at::randn({kSamples, 3}, gen, torch::kFloat)).contiguous();
  torch::manual_seed(5);
  auto net = torch::nn::Sequential(torch::nn::Linear(24, 16), torch::nn::Tanh(), torch::nn::Linear(16, 3));
  const auto initial = net->parameters()[0].clone();
  auto program = std::make_shared<ProgramModule>(
      net.ptr(), [](torch::nn::Module& m, const at::Tensor& bx, const at::Tensor& by) {
        const auto out = dynamic_cast<torch::nn::SequentialImpl&>(m).forward(bx);
        const auto err = out - by;
        return ProgramLoss{err.square().mean(1), {{"mae", err.abs().mean()}}};
      });
  auto data = std::make_shared<ProgramData>();
  data->train.source = std::make_shared<ArraysSource>(x, y);
  auto cfg = parseConfig("model: {name: program}\ndata: {name: program, val_fraction: 0.1}\n"
                         "batch: {global: " + std::to_string(G) + ", per_gpu: 16, last_batch: pad}\n"
                         "optim: {name: sgd, lr: 0.1, base_batch: " + std::to_string(G) +
                             ", momentum: 0.9, warmup_steps: 2}\n"
                         "train: {epochs: 3, seed: 3}\n",
                         "program.yaml");
  cfg.model.program = program;
  cfg.data.program = data;
  const auto load = [](const Config& c) {
    DataContext ctx;
    ctx.module_targets = trainsModuleLoss(c);
    return loadData(c.data, c.train.seed, "", ctx);
  };
  const auto split = load(cfg);
  ASSERT_NE(split.train.size() % G, 0) << split.train.size() << " training samples, G " << G;
  const auto weights = testsupport::weightsForEverySplit(cfg, 30, "gloo", load, [&](StepEngine& trainer) {
    EXPECT_EQ(trainer.task().kind(), TaskKind::kModuleLoss);
    EXPECT_EQ(trainer.task().metrics({0.0, 0.0}, 1.0).at(1).name, "mae");
  });
  // The module trained: its weights moved from those handed over.
  EXPECT_GT((net->parameters()[0] - initial).abs().max().item<double>(), 1e-3);
  if (mpitest::worldRank() == 0) expectSameForEverySplit(weights, "program module sgd/pad");
}
