// World-size invariance (Note [loss normalisation]): the same global batch split
// as (W=1, a=P), ..., (W=P, a=1) over real ranks gives the same weights.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mpi_helpers.h"
#include "split_invariance.h"
#include "tests/image_fixtures.h"
#include "tests/scratch_dir.h"
#include "worker/data/sources/npy.h"
#include "worker/train/step/step_engine.h"

using namespace batchdist;
using namespace batchdist::worker;
using batchdist::testsupport::expectSameAsOneRank;
using batchdist::testsupport::trainSteps;
using batchdist::testsupport::weightsForEverySplit;

namespace {

Config invarianceConfig(int64_t global, const std::string& policy, const std::string& optim,
                        const std::string& optim_extra = "") {
  return parseConfig(
      "model: {name: mlp, hidden: [32, 16], batchnorm: false}\n"
      "data: {name: synthetic, samples: 421, shape: [12], classes: 5, val_fraction: 0.1}\n"
      "batch: {global: " + std::to_string(global) + ", per_gpu: 16, last_batch: " + policy + "}\n"
      "optim: {name: " + optim + ", lr: 0.2, base_batch: " + std::to_string(global) +
          ", momentum: 0.9, weight_decay: 0.001, warmup_steps: 2" + optim_extra + "}\n"
      "train: {epochs: 3, seed: 3}\n",
      "invariance.yaml");
}

/// SGD's update is linear in the gradient, so float summation order is all that
/// differs (~1e-7). Adam divides by sqrt(v): rounding differences in small
/// gradients are amplified, so it gets a looser bound.
void expectSameWeightsForEverySplit(const std::string& policy, const std::string& optim,
                                    double tolerance, const std::string& backend = "gloo",
                                    const std::string& optim_extra = "") {
  const int64_t G = 16 * mpitest::worldSize();
  // 30 steps cross an epoch boundary (and the padded last batch under pad).
  const auto weights =
      weightsForEverySplit(invarianceConfig(G, policy, optim, optim_extra), 30, backend);
  expectSameAsOneRank(weights, tolerance, backend + " " + optim + "/" + policy + " m=16", G);
}

}  // namespace

namespace {

/// Note [task]: float targets, N x 2, in .npy files of this process's own
/// directory (the same bytes on every rank: seeded).
std::string writeRegressionArrays(const std::string& dir) {
  auto gen = at::detail::createCPUGenerator(11);
  const auto x = at::rand({421, 12}, gen, torch::kFloat);
  const auto w = at::randn({12, 2}, gen, torch::kFloat);
  const auto y = (x.matmul(w) + 0.01 * at::randn({421, 2}, gen, torch::kFloat)).contiguous();
  const auto bytes = [](const at::Tensor& t) {
    return std::string(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  };
  batchdist::testing::writeFile(dir + "/x.npy", batchdist::testing::makeNpy(NpyType::kFloat32, {421, 12}, bytes(x)));
  batchdist::testing::writeFile(dir + "/y.npy", batchdist::testing::makeNpy(NpyType::kFloat32, {421, 2}, bytes(y)));
  return dir;
}

}  // namespace

// Note [loss normalisation] holds for a task's per-sample loss whatever it is: the
// regression task's mse over every split G = m x a x W, the padded last batch included.
TEST(WorldSizeInvariance, RegressionPad) {
  const batchdist::testsupport::ScratchDir dir("invariance_regression");
  writeRegressionArrays(dir.string());
  const int P = mpitest::worldSize();
  const int64_t G = 16 * P;
  const auto cfg = parseConfig(
      "task: {name: regression}\n"
      "model: {name: mlp, hidden: [32, 16], batchnorm: false}\n"
      "data: {name: npy, path: " + dir.string() + ", val_fraction: 0.1}\n"
      "batch: {global: " + std::to_string(G) + ", per_gpu: 16, last_batch: pad}\n"
      "optim: {name: sgd, lr: 0.1, base_batch: " + std::to_string(G) + ", momentum: 0.9, warmup_steps: 2}\n"
      "train: {epochs: 3, seed: 3}\n",
      "regression.yaml");
  expectSameAsOneRank(weightsForEverySplit(cfg, 30), 1e-5, "regression sgd/pad m=16", G);
}

TEST(WorldSizeInvariance, SgdDrop) { expectSameWeightsForEverySplit("drop", "sgd", 1e-5); }
// The overlapped reducer's hooks call MPI from autograd (Note [mpi backend]).
TEST(WorldSizeInvariance, SgdPadOverMpi) { expectSameWeightsForEverySplit("pad", "sgd", 1e-5, "mpi"); }
TEST(WorldSizeInvariance, SgdPad) { expectSameWeightsForEverySplit("pad", "sgd", 1e-5); }
TEST(WorldSizeInvariance, LarsDrop) { expectSameWeightsForEverySplit("drop", "lars", 1e-5); }
TEST(WorldSizeInvariance, AdamwPad) { expectSameWeightsForEverySplit("pad", "adamw", 2e-4); }
// Note [gradient clipping]: a bound this low clips every step, so a norm taken of
// one rank's or one micro-batch's gradient instead of the step's would differ by
// split (SGD: the update is the clipped gradient itself, no normalisation to hide it).
TEST(WorldSizeInvariance, SgdPadClipped) {
  expectSameWeightsForEverySplit("pad", "sgd", 1e-5, "gloo", ", clip_grad_norm: 0.05");
}

namespace {

/// Note [tokens]: `n` uint16 ids in 0..63, a walk whose steps come from a 32-bit
/// LCG (the same bytes on every rank and platform), so the model has something
/// to learn.
std::string tokenWalk(int64_t n, uint32_t x) {
  std::vector<uint16_t> ids(static_cast<std::size_t>(n));
  uint32_t prev = 0;
  for (auto& id : ids) {
    x = x * 1664525u + 1013904223u;
    prev = (prev * 5 + (x >> 28)) % 64;
    id = static_cast<uint16_t>(prev);
  }
  return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(uint16_t));
}

/// A GPT on token windows in `dir` (this process's own): 150 training windows of
/// 8 + 1 tokens, 5 validation windows. m = 8 windows, G = 8P: 150 leaves a
/// remainder at P = 2, 3 and 4 (6, 6, 22), so drop drops and pad pads, and 30
/// steps cross 3 to 7 epochs. Dropout 0: the forward is a function of the weights.
Config gptInvarianceConfig(const std::string& dir, int64_t global, const std::string& policy,
                           const std::string& optim, const std::string& extra = "") {
  batchdist::testing::writeFile(dir + "/train.bin", tokenWalk(150 * 8 + 1, 7));
  batchdist::testing::writeFile(dir + "/val.bin", tokenWalk(5 * 8 + 1, 8));
  // Note [gpt]: the key third of each attn.c_attn.bias has a zero gradient in exact
  // arithmetic (adding one constant to every score of a query leaves its softmax
  // unchanged), so Adam at its eps 1e-8 divides float rounding by its own size and
  // steps up to lr on it, whichever way the rounding fell: W=1 and W=P measured
  // 4e-4 apart at lr 1e-2 (every other tensor <= 1e-5), 2e-6 at lr 1e-3. eps 1e-6
  // damps that, so the bound below tests the synchronised gradient, not Adam's
  // amplification of a zero.
  const std::string update = optim == "sgd" ? "lr: 0.2, momentum: 0.9" : "lr: 0.001, eps: 1.0e-6";
  const auto G = std::to_string(global);
  return parseConfig(
      "model: {name: gpt, layers: 2, heads: 2, embed: 16, vocab: 64, seq_len: 8, dropout: 0.0}\n"
      "data: {name: tokens, path: " + dir + "/train.bin, val_path: " + dir + "/val.bin}\n"
      "batch: {global: " + G + ", per_gpu: 8, last_batch: " + policy + "}\n"
      "optim: {name: " + optim + ", " + update + ", base_batch: " + G +
          ", weight_decay: 0.001, warmup_steps: 2}\n"
      "train: {epochs: 3, seed: 3}\n" + extra,
      "gpt_invariance.yaml");
}

/// Note [loss normalisation] for the language model (Note [language model]): a
/// window's loss is its tokens' mean cross-entropy, weighted like any sample's.
/// The bound, from measurement (the same GPT and tokens through the launcher, 30
/// steps, W=1 with a=P against every other W dividing P, P = 2, 3, 4, pad and
/// drop, over Gloo and MPI): max |dw| <= 2.4e-7 with SGD and <= 1.2e-7 with AdamW
/// (one or two float32 ulps of a LayerNorm weight near 1), while one step moves
/// the weights by up to 2.3e-2 (SGD, lr 0.2) and 1.2e-3 (AdamW, lr 1e-3). 1e-5 is
/// 40x the noise and under 1 % of a step; training must have moved the weights
/// (by > 1e-3), or equal weights would prove nothing.
void expectSameGptForEverySplit(const std::string& policy, const std::string& optim) {
  const batchdist::testsupport::ScratchDir dir("invariance_gpt");
  const int64_t G = 8 * mpitest::worldSize();
  const auto cfg = gptInvarianceConfig(dir.string(), G, policy, optim);
  const auto weights = weightsForEverySplit(cfg, 30);
  expectSameAsOneRank(weights, 1e-5, "gpt " + optim + "/" + policy + " m=8", G);
  torch::Tensor initial;
  mpitest::inGroup(1, [&](collective::Communicator& comm) { initial = trainSteps(cfg, comm, 0); });
  if (mpitest::worldRank() != 0) return;
  const double moved = (weights.at(1) - initial).abs().max().item<double>();
  EXPECT_GT(moved, 1e-3) << "gpt " << optim << "/" << policy << ": 30 steps moved no weight";
}

}  // namespace

// Note [parameter units] on the GPT: the embeddings, each block and the head
// (which reads the tied wte) gathered per use; with recompute (the replay inside
// its unit), without resharding, without prefetch: the weights of plain data
// parallel after 30 steps on every rank of the job (no accumulation: the same
// sums; bitwise on this machine, printed).
TEST(ShardedParameters, GptStepsAsUnshardedWithEveryOption) {
  const batchdist::testsupport::ScratchDir dir("sharded_gpt");
  const int P = mpitest::worldSize();
  // "(model.recompute: on)": the model's key set on the parsed config (the YAML
  // already has a model map).
  const auto cfg = [&](const std::string& variant) {
    const auto cut = variant.find("\n(");
    auto c = gptInvarianceConfig(dir.string(), 8 * P, "pad", "adamw", variant.substr(0, cut) + "\n");
    if (cut != std::string::npos) c.model.recompute = Recompute::kOn;
    return c;
  };
  torch::Tensor plain;
  mpitest::inGroup(P, [&](collective::Communicator& comm) { plain = trainSteps(cfg(""), comm, 30); });
  for (const std::string variant :
       {"dist: {shard: parameters}", "dist: {shard: parameters}\n(model.recompute: on)",
        "dist: {shard: parameters, reshard_after_forward: false}",
        "dist: {shard: parameters, prefetch: false}"}) {
    torch::Tensor sharded;
    mpitest::inGroup(P, [&](collective::Communicator& comm) {
      sharded = trainSteps(cfg(variant), comm, 30, batchdist::testsupport::loadPlainData,
                           [&](StepEngine& t) { EXPECT_NE(t.update().unitHooks(), nullptr) << variant; });
    });
    ASSERT_TRUE(sharded.defined() && plain.defined());
    const double diff = (sharded - plain).abs().max().item<double>();
    EXPECT_LE(diff, 1e-6 * plain.abs().max().item<double>()) << variant;
    if (mpitest::worldRank() == 0) {
      std::printf("[ shard ] gpt %s on %d ranks: max |w - w(none)| = %.3g%s\n", variant.c_str(), P,
                  diff, torch::equal(sharded, plain) ? ", bitwise equal" : "");
    }
  }
}

TEST(WorldSizeInvariance, GptSgdPad) { expectSameGptForEverySplit("pad", "sgd"); }
TEST(WorldSizeInvariance, GptSgdDrop) { expectSameGptForEverySplit("drop", "sgd"); }
TEST(WorldSizeInvariance, GptAdamwPad) { expectSameGptForEverySplit("pad", "adamw"); }
TEST(WorldSizeInvariance, GptAdamwDrop) { expectSameGptForEverySplit("drop", "adamw"); }

TEST(Trainer, DistributedEvaluationCountsEverySampleOnce) {
  const int P = mpitest::worldSize();
  const auto cfg = invarianceConfig(16 * P, "drop", "sgd");
  std::map<int, EvalResult> results;
  for (int W : {1, P}) {
    mpitest::inGroup(W, [&](collective::Communicator& comm) {
      const auto data = loadData(cfg.data, cfg.train.seed, "");
      const auto plan = makePlan(cfg, comm.size(), data.train.size(), false);
      StepEngine trainer(cfg, comm, data, at::kCPU, plan);
      const auto r = trainer.evaluate();
      if (comm.rank() == 0) results[W] = r;
    });
  }
  if (mpitest::worldRank() != 0) return;
  EXPECT_EQ(results[1].samples, 42);
  EXPECT_EQ(results[P].samples, 42);
  EXPECT_EQ(metricValue(results[P].metrics, "accuracy", -1), metricValue(results[1].metrics, "accuracy", -2));
  EXPECT_NEAR(results[P].loss, results[1].loss, 1e-6);
}

namespace {
/// Parameters and BatchNorm buffers of rank 0 after `steps` steps of a BN model
/// with per-GPU batch G / W and no accumulation.
torch::Tensor trainBn(bool sync, int W, int64_t G, int64_t steps, bool recompute = false) {
  auto cfg = parseConfig(
      "model: {name: mlp, hidden: [32, 16], batchnorm: true, sync_batchnorm: " +
          std::string(sync ? "true" : "false") + ", recompute: " + (recompute ? "on" : "off") +
          "}\n"
          "data: {name: synthetic, samples: 600, shape: [12], classes: 5, val_fraction: 0.1}\n"
          "batch: {global: " + std::to_string(G) + ", per_gpu: " + std::to_string(G / W) +
          "}\noptim: {name: sgd, lr: 0.1, base_batch: 64, momentum: 0.9}\ntrain: {seed: 5}\n",
      "syncbn.yaml");
  torch::Tensor out;
  mpitest::inGroup(W, [&](collective::Communicator& comm) {
    const auto data = loadData(cfg.data, cfg.train.seed, "");
    const auto plan = makePlan(cfg, comm.size(), data.train.size(), true);
    StepEngine trainer(cfg, comm, data, at::kCPU, plan);
    Sharder sharder(plan, static_cast<uint64_t>(cfg.train.seed));
    trainer.loader().start(trainer.jobs(sharder, 0, steps), 0);
    for (int64_t s = 0; s < steps; ++s) trainer.trainStep(sharder.realSamples(s), plan.lrAt(s));
    std::vector<torch::Tensor> flat;
    for (const auto& t : trainer.model().state()) flat.push_back(t.detach().to(torch::kDouble).reshape({-1}));
    if (comm.rank() == 0) out = torch::cat(flat);
  });
  return out;
}
}  // namespace

TEST(SyncBatchNorm, WRanksOfMSamplesMatchOneRankOfWM) {
  const int P = mpitest::worldSize();
  const int64_t G = 16 * P;
  const auto one = trainBn(true, 1, G, 8);
  const auto synced = trainBn(true, P, G, 8);
  const auto local = trainBn(false, P, G, 8);
  if (mpitest::worldRank() != 0) return;
  const double d_sync = (synced - one).abs().max().item<double>();
  const double d_local = (local - one).abs().max().item<double>();
  std::printf("[ syncbn ] W=%d m=%lld vs W=1 m=%lld: max |diff| synced %.3g, per-rank BN %.3g\n", P,
              static_cast<long long>(G / P), static_cast<long long>(G), d_sync, d_local);
  EXPECT_LT(d_sync, 1e-4);
  EXPECT_GT(d_local, 1e-3);  // the test can tell: per-rank statistics do differ
}

// Note [recompute replay]: under recompute a SyncBatchNorm layer allreduces its
// sums in the first pass only and the replay reuses them; weights and running
// statistics after 8 steps are those without recompute: bitwise on 2 ranks; on 3
// or more to rounding, since recompute makes a block's gradients ready together,
// the Reducer's buckets (learned from arrival order) differ, and a ring allreduce
// of W > 2 sums an element in an order that depends on its place in the bucket.
TEST(SyncBatchNorm, RecomputeReplaysTheGlobalStatisticsBitwise) {
  const int P = mpitest::worldSize();
  const int64_t G = 16 * P;
  const auto plain = trainBn(true, P, G, 8);
  const auto recomputed = trainBn(true, P, G, 8, /*recompute=*/true);
  if (mpitest::worldRank() != 0) return;
  const double diff = (recomputed - plain).abs().max().item<double>();
  std::printf("[ syncbn ] W=%d recompute vs not: max |diff| %.3g\n", P, diff);
  if (P <= 2) {
    EXPECT_TRUE(torch::equal(recomputed, plain)) << "max |diff| " << diff;
  } else {
    EXPECT_LE(diff, 1e-6 * plain.abs().max().item<double>());
  }
}

TEST(SyncBatchNorm, LocalScopePausesOneModelAndIsUndoneOnThrow) {
  const int P = mpitest::worldSize();
  if (P < 2) GTEST_FAIL() << "needs 2 or more ranks (registered with mpirun -np >= 2)";
  ModelConfig cfg;
  cfg.name = ModelName::kCnn;
  cfg.sync_batchnorm = true;
  mpitest::inGroup(P, [&](collective::Communicator& comm) {
    auto a = buildModel(cfg, {1, 8, 8}, 10, "", &comm);
    auto b = buildModel(cfg, {1, 8, 8}, 10, "", &comm);
    ASSERT_NE(a->syncBatchNorm(), nullptr);
    EXPECT_TRUE(a->syncBatchNorm()->synchronising());
    try {
      const LocalBatchNorm outer(*a);
      {
        const LocalBatchNorm inner(*a);  // scopes nest
        EXPECT_FALSE(a->syncBatchNorm()->synchronising());
      }
      EXPECT_FALSE(a->syncBatchNorm()->synchronising());
      EXPECT_TRUE(b->syncBatchNorm()->synchronising());  // per model, not process-wide
      throw std::runtime_error("a step failed");
    } catch (const std::runtime_error&) {
    }
    EXPECT_TRUE(a->syncBatchNorm()->synchronising());
  });
}

namespace {

Config channelsConfig(const std::string& format, const std::string& shard) {
  const int64_t G = 8 * mpitest::worldSize();
  return parseConfig(
      "model: {name: cnn}\n"
      "data: {name: synthetic_images, samples: 300, shape: [3, 12, 12], classes: 4, "
      "val_fraction: 0.1, hflip: true}\n"
      "batch: {global: " + std::to_string(G) + ", per_gpu: 4}\n"
      "optim: {name: sgd, lr: 0.05, momentum: 0.9, base_batch: " + std::to_string(G) + "}\n"
      "dist: {shard: " + shard + "}\n"
      "train: {epochs: 2, seed: 9, memory_format: " + format + "}\n",
      "channels_last.yaml");
}

}  // namespace

// Note [channels last]: the cnn trained NHWC (its weights, its batches, the
// reducer's gradient views: Note [bucket view layout]) gives the weights it
// gives NCHW, to the convolution algorithms' rounding, with accumulation (per-GPU
// 4 of 8) and under dist.shard: optimizer (whose flat buffer makes the weights
// contiguous again; the batches stay NHWC). And NHWC is what ran. 20 steps on 2
// ranks differ by ~1e-7 of max |w|: to 1e-5. No data.crop_padding here: its zero
// borders make exact ties in max pooling, whose gradient the NCHW and NHWC
// kernels may route to different (equally valid) inputs: ~1e-3 after 20 steps.
TEST(ChannelsLast, TrainsAsContiguous) {
  torch::Tensor nchw, nhwc, sharded;
  mpitest::inGroup(mpitest::worldSize(), [&](collective::Communicator& comm) {
    nchw = trainSteps(channelsConfig("contiguous", "none"), comm, 20);
    nhwc = trainSteps(channelsConfig("channels_last", "none"), comm, 20, testsupport::loadPlainData,
                      [](StepEngine& t) {
                        int64_t convs = 0;
                        for (const auto& p : t.model().parameters()) {
                          if (p.dim() != 4) continue;
                          ++convs;
                          EXPECT_TRUE(p.is_contiguous(at::MemoryFormat::ChannelsLast));
                          EXPECT_FALSE(p.is_contiguous());
                        }
                        EXPECT_GT(convs, 0);
                        EXPECT_TRUE(t.model().channelsLast());
                      });
    sharded = trainSteps(channelsConfig("channels_last", "optimizer"), comm, 20);
  });
  ASSERT_TRUE(nchw.defined() && nhwc.defined() && sharded.defined());
  const double scale = nchw.abs().max().item<double>();
  EXPECT_LE((nhwc - nchw).abs().max().item<double>(), 1e-5 * scale);
  EXPECT_LE((sharded - nchw).abs().max().item<double>(), 1e-5 * scale);
}
