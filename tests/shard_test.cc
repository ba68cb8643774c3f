// Note [sharded optimizer] with real ranks (an mpirun job of 2, 3 or 4): 50 steps
// under dist.shard: optimizer give the weights of the same 50 steps unsharded,
// for sgd with momentum, adamw and lars, with accumulation and a padded last batch;
// Note [sharded checkpoint]: sharded and unsharded checkpoints resume on every
// world size, sharded or not.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpi_helpers.h"
#include "split_invariance.h"
#include "common/error.h"
#include "worker/common/console.h"
#include "worker/model/optimizer.h"
#include "worker/plan/plan.h"
#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/shard/sharded_optimizer.h"
#include "worker/train/step/step_engine.h"

using namespace batchdist;
using namespace batchdist::worker;
using batchdist::testsupport::trainSteps;

namespace {

/// These tests read the files right after save(): written in the foreground
/// (Note [background checkpoint]; the background's own test is in checkpoint_test.cc).
batchdist::worker::CheckpointConfig foreground(batchdist::worker::CheckpointConfig c) {
  c.background = false;
  return c;
}

/// 421 samples: the last batch of an epoch is padded. An mlp of 1 067 parameters:
/// not a multiple of 2, 3 or 4, so the last rank's slice holds the pad, and
/// several parameters straddle two slices. Per-GPU 8 of G = 16 W: accumulation 2.
/// Under dist.shard: gradients, segments of at most 262 floats (bucket_mb 0.001):
/// four (Note [shard layout]), each with its own chunks and pad.
Config shardConfig(const std::string& optim, const std::string& shard, int64_t per_gpu = 8,
                   const std::string& precision = "fp32") {
  const int64_t G = 16 * mpitest::worldSize();
  return parseConfig(
      "model: {name: mlp, hidden: [32, 17], batchnorm: false}\n"
      "data: {name: synthetic, samples: 421, shape: [12], classes: 5, val_fraction: 0.1}\n"
      "batch: {global: " + std::to_string(G) + ", per_gpu: " + std::to_string(per_gpu) + ", last_batch: pad}\n"
      "optim: {" + optim + ", base_batch: " + std::to_string(G) + ", warmup_steps: 2}\n"
      "dist: {shard: " + shard + (shard == "gradients" ? ", bucket_mb: 0.001" : "") + "}\n"
      "train: {epochs: 3, seed: 5, precision: " + precision + "}\n",
      "shard_test.yaml");
}

/// Each rank's weights after 50 steps, unsharded and sharded, over every rank of
/// the job: within `tolerance` of max |w|. Bitwise equality is printed, not
/// asserted: it holds on this project's CPUs (every element takes the same
/// arithmetic in a piece as in its whole tensor), but a kernel that treats a
/// tensor's unaligned tail apart (scalar vs fused multiply-add) could differ by
/// an ulp at piece boundaries on another machine.
void expectShardedEqualsUnsharded(const std::string& optim, double tolerance,
                                  const std::string& backend = "gloo",
                                  const std::string& shard = "optimizer", int64_t per_gpu = 8) {
  torch::Tensor plain, sharded;
  mpitest::inGroup(mpitest::worldSize(), [&](collective::Communicator& comm) {
    plain = trainSteps(shardConfig(optim, "none", per_gpu), comm, 50);
    sharded = trainSteps(shardConfig(optim, shard, per_gpu), comm, 50,
                         testsupport::loadPlainData, [&](StepEngine& t) {
                           auto* s = dynamic_cast<ShardedOptimizer*>(&t.update().optimizer());
                           ASSERT_NE(s, nullptr) << "dist.shard: " << shard << " built no sharded optimizer";
                           EXPECT_EQ(s->layout().total, 1067);
                           if (shard == "gradients") {
                             EXPECT_EQ(s->layout().segments.size(), 4u);
                           } else if (shard == "parameters") {  // a segment per layer
                             EXPECT_EQ(s->layout().segments.size(), 3u);
                             EXPECT_NE(t.update().unitHooks(), nullptr);
                           } else {
                             EXPECT_EQ(s->layout().slice, (1067 + comm.size() - 1) / comm.size());
                           }
                         });
  }, backend);
  ASSERT_TRUE(plain.defined() && sharded.defined());
  ASSERT_EQ(plain.numel(), 1067);
  const double diff = (sharded - plain).abs().max().item<double>();
  const double scale = plain.abs().max().item<double>();
  const bool bitwise = torch::equal(sharded, plain);
  EXPECT_LE(diff, tolerance * scale) << optim << " on " << mpitest::worldSize() << " ranks";
  std::printf("[ shard ] %s %s rank %d/%d %s, per-GPU %lld of %d: max |w_sharded - w| = %.3g (max |w| %.3g)%s\n",
              shard.c_str(), backend.c_str(), mpitest::worldRank(), mpitest::worldSize(), optim.c_str(),
              static_cast<long long>(per_gpu), 16 * mpitest::worldSize(), diff, scale,
              bitwise ? ", bitwise equal" : "");
}

TEST(ShardedOptimizer, SgdWithMomentumStepsAsUnsharded) {
  expectShardedEqualsUnsharded("name: sgd, lr: 0.2, momentum: 0.9, weight_decay: 0.001", 1e-6);
}

TEST(ShardedOptimizer, NesterovStepsAsUnsharded) {
  expectShardedEqualsUnsharded(
      "name: sgd, lr: 0.2, momentum: 0.9, nesterov: true, weight_decay: 0.001", 1e-6);
}

// Clipping reads the whole summed gradient, which every rank still holds.
TEST(ShardedOptimizer, AdamwWithClippingStepsAsUnsharded) {
  expectShardedEqualsUnsharded("name: adamw, lr: 0.01, weight_decay: 0.1, clip_grad_norm: 0.5",
                               1e-6);
}

// The MPI communicator's native all-gather (Note [flat collectives]).
TEST(ShardedOptimizer, SgdOverTheMpiCommunicatorStepsAsUnsharded) {
  expectShardedEqualsUnsharded("name: sgd, lr: 0.2, momentum: 0.9, weight_decay: 0.001", 1e-6,
                               "mpi");
}

TEST(ShardedOptimizer, LarsStepsAsUnsharded) {
  expectShardedEqualsUnsharded("name: lars, lr: 0.5, momentum: 0.9, weight_decay: 0.0005", 1e-6);
}

// Note [sharded gradients]: reduce-scattered per segment and micro-batch, the
// readers of the whole gradient fed by partial sums; the same updates. Without
// accumulation (per-GPU 16) the same sums in the same order: to 1e-6 (bitwise on
// 2 ranks here, printed). With it (per-GPU 8, two micro-batches) the ranks are
// summed per micro-batch before the micro-batches are: another rounding, which
// 50 steps of training carry to ~3e-6 of max |w| (measured, SGD on 2 ranks):
// to 1e-5.
void expectGradientShardingAsUnsharded(const std::string& optim, const std::string& backend = "gloo") {
  expectShardedEqualsUnsharded(optim, 1e-6, backend, "gradients", 16);
  expectShardedEqualsUnsharded(optim, 1e-5, backend, "gradients", 8);
}

TEST(ShardedGradients, SgdWithMomentumStepsAsUnsharded) {
  expectGradientShardingAsUnsharded("name: sgd, lr: 0.2, momentum: 0.9, weight_decay: 0.001");
}

TEST(ShardedGradients, AdamwWithClippingStepsAsUnsharded) {
  expectGradientShardingAsUnsharded("name: adamw, lr: 0.01, weight_decay: 0.1, clip_grad_norm: 0.5");
}

// Note [parameter units]: each layer gathered per use, its gradients
// reduce-scattered as under dist.shard: gradients, the optimizer stepping this
// rank's shard: the same tolerances as ZeRO-2's (the same sums).
TEST(ShardedParameters, SgdWithMomentumStepsAsUnsharded) {
  const std::string sgd = "name: sgd, lr: 0.2, momentum: 0.9, weight_decay: 0.001";
  expectShardedEqualsUnsharded(sgd, 1e-6, "gloo", "parameters", 16);
  expectShardedEqualsUnsharded(sgd, 1e-5, "gloo", "parameters", 8);
}

TEST(ShardedParameters, AdamwWithClippingOverTheMpiCommunicatorStepsAsUnsharded) {
  const std::string adamw = "name: adamw, lr: 0.01, weight_decay: 0.1, clip_grad_norm: 0.5";
  expectShardedEqualsUnsharded(adamw, 1e-6, "mpi", "parameters", 16);
  expectShardedEqualsUnsharded(adamw, 1e-5, "gloo", "parameters", 8);
}

TEST(ShardedGradients, LarsStepsAsUnsharded) {
  expectGradientShardingAsUnsharded("name: lars, lr: 0.5, momentum: 0.9, weight_decay: 0.0005");
}

// The MPI communicator's native reduce-scatter (Note [flat collectives]).
TEST(ShardedGradients, NesterovOverTheMpiCommunicatorStepsAsUnsharded) {
  expectGradientShardingAsUnsharded(
      "name: sgd, lr: 0.2, momentum: 0.9, nesterov: true, weight_decay: 0.001", "mpi");
}

// Note [multi-tensor step]: each optimizer's multi-tensor and fused steps
// (optim.kernels), sharded or not, in fp32 and bf16, give the weights of its
// per-tensor step unsharded over 50 steps: to 1e-5 of max |w| (the fused kernels
// and lars's trust ratios are within 1e-6 a step, not bitwise); in bf16 to 1e-4,
// since a weight that moved by an ulp can round a bf16 activation the other way
// (fused adamw, torch 2.14: 2e-5 measured).
TEST(ShardedKernels, EveryOptimizerStepsAsItsPerTensorStepUnsharded) {
  for (const std::string optim : {"name: sgd, lr: 0.2, momentum: 0.9, nesterov: true, weight_decay: 0.001",
                                  "name: adamw, lr: 0.01, weight_decay: 0.1, clip_grad_norm: 0.5",
                                  "name: lars, lr: 0.5, momentum: 0.9, weight_decay: 0.0005"}) {
    for (const std::string precision : {"fp32", "bf16"}) {
      torch::Tensor reference;
      mpitest::inGroup(mpitest::worldSize(), [&](collective::Communicator& comm) {
        reference = trainSteps(shardConfig(optim + ", kernels: per_tensor", "none", 16, precision), comm, 50);
      });
      for (const std::string kernels : {"multi_tensor", "fused"}) {
        // Not fused adamw in bf16: Adam moves a weight by about lr whatever its
        // gradient's size, so a gradient near 0 that the fused kernel's rounding
        // (within 1e-6, FusedStep) lets a bf16 activation flip moves it lr the
        // other way: 1e-2 of max |w| after 50 steps on 3 ranks (torch 2.14).
        // fused adamw is compared in fp32 here, and in bf16 only multi_tensor
        // (bitwise the per-tensor step).
        if (precision == "bf16" && kernels == "fused" && optim.find("adamw") != std::string::npos) continue;
        for (const std::string shard : {"none", "optimizer", "gradients"}) {
          SCOPED_TRACE(strCat(optim, "; ", precision, ", ", kernels, ", dist.shard: ", shard));
          torch::Tensor w;
          mpitest::inGroup(mpitest::worldSize(), [&](collective::Communicator& comm) {
            const auto cfg = shardConfig(optim + ", kernels: " + kernels, shard, 16, precision);
            w = trainSteps(cfg, comm, 50, testsupport::loadPlainData, [&](StepEngine& t) {
              EXPECT_NE(t.update().optimizer().kernels(), StepKernels::kPerTensor);
            });
          });
          ASSERT_TRUE(reference.defined() && w.defined());
          const double diff = (w - reference).abs().max().item<double>();
          EXPECT_LE(diff, (precision == "bf16" ? 1e-4 : 1e-5) * reference.abs().max().item<double>());
        }
      }
    }
  }
}

}  // namespace

namespace {

/// Steps [from, to) of `cfg` on the ranks of `comm`: a StepEngine that first restores
/// `resume` (when given) and then, when `save_dir` is not empty, writes a
/// checkpoint there after step `to` (the sharded state in chunks of `chunk` bytes).
/// `check` sees the trainer after the restore, `after` after the last step.
/// Returns the flattened parameters.
torch::Tensor trainFromTo(const Config& cfg, collective::Communicator& comm, int64_t from,
                          int64_t to, const CheckpointCheck* resume, const std::string& save_dir,
                          const std::function<void(StepEngine&)>& check = {},
                          const std::function<void(StepEngine&)>& after = {}) {
  const auto data = testsupport::loadPlainData(cfg);
  const auto plan = makePlan(cfg, comm.size(), data.train.size(), false);
  StepEngine trainer(cfg, comm, data, at::kCPU, plan);
  if (resume) restoreState(*resume, trainer.state(), comm.rank(), comm.size());
  if (check) check(trainer);
  Sharder sharder(plan, static_cast<uint64_t>(cfg.train.seed));
  for (int64_t g = from; g < to;) {
    const int64_t epoch = g / plan.steps_per_epoch, s = g % plan.steps_per_epoch;
    const int64_t n = std::min(plan.steps_per_epoch - s, to - g);
    sharder.setEpoch(epoch);
    trainer.loader().start(trainer.jobs(sharder, s, n), epoch, sharder.jobIndex(s));
    for (int64_t i = 0; i < n; ++i, ++g) trainer.trainStep(sharder.realSamples(s + i), plan.lrAt(g));
  }
  if (after) after(trainer);
  if (!save_dir.empty()) {
    CheckpointIdentity id;
    id.plan = plan;
    id.config = cfg.resolved;
    Checkpointer ck(foreground(cfg.checkpoint), save_dir, id, comm);
    ck.setStateChunkBytes(100);  // chunks that end inside a rank's slice and an element
    Console quiet(false, ProgressStyle::kOff);
    TrainPosition pos;
    pos.global_step = to;
    const auto rec = ck.save(trainer.state(), pos, false, quiet);
    EXPECT_TRUE(rec.error.empty()) << rec.error;
  }
  const WholeParameters whole(trainer.model());  // Note [parameter units]
  std::vector<torch::Tensor> flat;
  for (const auto& p : trainer.model().parameters()) flat.push_back(p.detach().reshape({-1}));
  return torch::cat(flat);
}

/// Each piece of `sharded`'s state equals its range of `whole`'s, bit for bit.
void expectPiecesOf(ShardedOptimizer& sharded, Optimizer& whole, const std::string& label) {
  ASSERT_EQ(sharded.stateNames(), whole.stateNames());
  for (std::size_t j = 0; j < sharded.pieces().size(); ++j) {
    const auto& p = sharded.pieces()[j];
    const auto i = static_cast<std::size_t>(p.param);
    EXPECT_EQ(sharded.stepCount(j), whole.stepCount(i)) << label << " piece " << j;
    for (std::size_t k = 0; k < whole.stateNames().size(); ++k) {
      EXPECT_TRUE(torch::equal(sharded.stateVector(j, k),
                               whole.stateVector(i, k).narrow(0, p.offset, p.length)))
          << label << ": piece " << j << " (parameter " << i << " [" << p.offset << ", +"
          << p.length << ")) " << whole.stateNames()[k];
    }
  }
}

ShardedOptimizer& shardedOf(StepEngine& t) {
  auto* s = dynamic_cast<ShardedOptimizer*>(&t.update().optimizer());
  if (!s) throw std::runtime_error("not a sharded optimizer");
  return *s;
}

/// Note [sharded checkpoint] with real ranks: a run of W = P ranks under each of
/// dist.shard: none, optimizer and gradients checkpoints after 20 steps. Every world size W' that splits
/// G resumes each of them under each sharding: the state each rank restores is
/// the checkpoint's, bit for bit, in whatever slices W' gives it, and 20 more
/// steps land on the weights of 40 uninterrupted ones.
void expectResumesAnywhere(const std::string& optim) {
  const int P = mpitest::worldSize();
  const auto dir = mpitest::sharedScratchDir("shard_checkpoint");
  const auto sharded_dir = (dir / "sharded").string(), plain_dir = (dir / "plain").string();
  torch::Tensor reference;
  const auto grads_dir = (dir / "gradients").string(), params_dir = (dir / "parameters").string();
  mpitest::inGroup(P, [&](collective::Communicator& comm) {
    reference = trainFromTo(shardConfig(optim, "none"), comm, 0, 40, nullptr, "");
    trainFromTo(shardConfig(optim, "optimizer"), comm, 0, 20, nullptr, sharded_dir);
    trainFromTo(shardConfig(optim, "none"), comm, 0, 20, nullptr, plain_dir);
    trainFromTo(shardConfig(optim, "gradients"), comm, 0, 20, nullptr, grads_dir);
    trainFromTo(shardConfig(optim, "parameters"), comm, 0, 20, nullptr, params_dir);
  });
  const auto sharded_ck = verifyCheckpoint(sharded_dir + "/step-00000020");
  const auto plain_ck = verifyCheckpoint(plain_dir + "/step-00000020");
  const auto grads_ck = verifyCheckpoint(grads_dir + "/step-00000020");
  const auto params_ck = verifyCheckpoint(params_dir + "/step-00000020");
  ASSERT_TRUE(sharded_ck.problem.empty()) << sharded_ck.problem;
  ASSERT_TRUE(plain_ck.problem.empty()) << plain_ck.problem;
  ASSERT_TRUE(grads_ck.problem.empty()) << grads_ck.problem;
  ASSERT_TRUE(params_ck.problem.empty()) << params_ck.problem;
  EXPECT_TRUE(params_ck.manifest.optimizer_state.has_value());
  EXPECT_TRUE(grads_ck.manifest.optimizer_state.has_value());
  EXPECT_TRUE(sharded_ck.manifest.optimizer_state.has_value());
  EXPECT_FALSE(std::filesystem::exists(sharded_dir + "/step-00000020/optimizer.pt"));
  EXPECT_FALSE(plain_ck.manifest.optimizer_state.has_value());
  for (int W = 1; W <= P; ++W) {
    if ((2 * P) % W != 0) continue;  // G = 16 P in per-GPU batches of 8
    for (const auto* ck : {&sharded_ck, &plain_ck, &grads_ck, &params_ck}) {
      for (const std::string shard : {"none", "optimizer", "gradients", "parameters"}) {
        const std::string label = strCat(optim, ": ", ck == &sharded_ck ? "sharded" : ck == &plain_ck ? "unsharded" : ck == &grads_ck ? "gradient-sharded" : "parameter-sharded",
                                         " checkpoint of ", P, " ranks resumed on ", W, ", ",
                                         shard);
        mpitest::inGroup(W, [&](collective::Communicator& comm) {
          const auto cfg = shardConfig(optim, shard);
          const auto w = trainFromTo(cfg, comm, 20, 40, ck, "", [&](StepEngine& t) {
            if (shard == "none") return;
            // What the checkpoint holds, read whole (an unsharded optimizer over
            // the same parameters), against this rank's slice as restored.
            const WholeParameters scope(t.model());  // Note [parameter units]
            auto whole = makeOptimizer(cfg.optim, t.model().trainableParameters());
            restoreState(*ck, TrainState{&t.model(), whole.get(), nullptr, at::kCPU}, comm.rank(),
                         comm.size());
            expectPiecesOf(shardedOf(t), *whole, label);
          });
          const double diff = (w - reference).abs().max().item<double>();
          const double scale = reference.abs().max().item<double>();
          // Same W: the same arithmetic as 40 uninterrupted steps. Another W sums
          // the gradient in another order (Note [loss normalisation]'s tolerances).
          // Either side under dist.shard: gradients sums the micro-batches in
          // another order too (Note [sharded gradients]).
          const bool same_order = W == P && ck != &grads_ck && ck != &params_ck &&
                                  shard != "gradients" && shard != "parameters";
          const double tolerance = same_order ? 1e-6 : (optim.find("adamw") != std::string::npos ? 2e-4 : 1e-5);
          EXPECT_LE(diff, tolerance * scale) << label;
          if (comm.rank() == 0) {
            std::printf("[ shard ] %s: max |w - w(40 uninterrupted)| = %.3g\n", label.c_str(), diff);
          }
        });
      }
    }
  }
  if (mpitest::worldRank() == 0) std::filesystem::remove_all(dir);
}

TEST(ShardedCheckpoint, AdamwResumesOnEveryWorldSizeShardedOrNot) {
  expectResumesAnywhere("name: adamw, lr: 0.01, weight_decay: 0.1");
}

TEST(ShardedCheckpoint, SgdResumesOnEveryWorldSizeShardedOrNot) {
  expectResumesAnywhere("name: sgd, lr: 0.2, momentum: 0.9, weight_decay: 0.001");
}

// Note [memory by part]: each rank's optimizer holds its slice's state only, K
// vectors of as many elements as its slice has parameters (rank 0: n = ceil(N/W),
// at most 1/W + 5 % of the unsharded state); parameters and gradients stay whole,
// but under dist.shard: gradients a rank keeps its shard of the gradient only.
TEST(ShardedOptimizer, EachRankHoldsItsSliceOfTheState) {
  const int P = mpitest::worldSize();
  mpitest::inGroup(P, [&](collective::Communicator& comm) {
    UpdateMemory plain, sharded;
    int64_t filled = 0;
    const std::string adamw = "name: adamw, lr: 0.01";
    trainFromTo(shardConfig(adamw, "none"), comm, 0, 3, nullptr, "", {},
                [&](StepEngine& t) { plain = t.update().memory(); });
    trainFromTo(shardConfig(adamw, "optimizer"), comm, 0, 3, nullptr, "", {}, [&](StepEngine& t) {
      sharded = t.update().memory();
      filled = shardedOf(t).layout().filled(comm.rank());
    });
    constexpr double kMb = 1 << 20;
    EXPECT_DOUBLE_EQ(plain.optimizer_state_mb * kMb, 2 * 1067 * 4) << "adamw: two moments";
    EXPECT_DOUBLE_EQ(sharded.optimizer_state_mb * kMb, 2.0 * filled * 4) << "rank " << comm.rank();
    EXPECT_LE(sharded.optimizer_state_mb, (1.0 / P + 0.05) * plain.optimizer_state_mb);
    EXPECT_DOUBLE_EQ(sharded.parameters_mb, plain.parameters_mb);
    EXPECT_DOUBLE_EQ(sharded.gradients_mb, plain.gradients_mb);
    EXPECT_DOUBLE_EQ(plain.parameters_mb * kMb, 1067 * 4);
    // Note [sharded gradients]: the gradient's shard too, its pads included.
    UpdateMemory zero2;
    int64_t shard_elements = 0;
    trainFromTo(shardConfig(adamw, "gradients"), comm, 0, 3, nullptr, "", {}, [&](StepEngine& t) {
      zero2 = t.update().memory();
      shard_elements = shardedOf(t).layout().slice;
    });
    EXPECT_DOUBLE_EQ(zero2.gradients_mb * kMb, 4.0 * shard_elements);
    EXPECT_LE(zero2.gradients_mb, (1.0 / P + 0.05) * plain.gradients_mb);
    EXPECT_LE(zero2.optimizer_state_mb, (1.0 / P + 0.05) * plain.optimizer_state_mb);
    if (comm.rank() == 0) {
      std::printf("[ shard ] adamw state on rank 0 of %d: %.0f of %.0f bytes (%.4f; 1/W = %.4f); "
                  "gradients under dist.shard: gradients %.0f of %.0f bytes (%.4f)\n", P,
                  sharded.optimizer_state_mb * kMb, plain.optimizer_state_mb * kMb,
                  sharded.optimizer_state_mb / plain.optimizer_state_mb, 1.0 / P,
                  zero2.gradients_mb * kMb, plain.gradients_mb * kMb,
                  zero2.gradients_mb / plain.gradients_mb);
    }
  });
}

}  // namespace
