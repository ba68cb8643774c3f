// Note [sharded optimizer] with real ranks (an mpirun job of 2, 3 or 4): 50 steps
// under dist.shard: optimizer give the weights of the same 50 steps unsharded,
// for sgd with momentum, adamw and lars, with accumulation and a padded last batch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>

#include "mpi_helpers.h"
#include "split_invariance.h"
#include "worker/train/sharded_optimizer.h"
#include "worker/train/trainer.h"

using namespace batchdist;
using namespace batchdist::worker;
using batchdist::testsupport::trainSteps;

namespace {

/// 421 samples: the last batch of an epoch is padded. An mlp of 1 067 parameters:
/// not a multiple of 2, 3 or 4, so the last rank's slice holds the pad, and
/// several parameters straddle two slices. Per-GPU 8 of G = 16 W: accumulation 2.
Config shardConfig(const std::string& optim, const std::string& shard) {
  const int64_t G = 16 * mpitest::worldSize();
  return parseConfig(
      "model: {name: mlp, hidden: [32, 17], batchnorm: false}\n"
      "data: {name: synthetic, samples: 421, shape: [12], classes: 5, val_fraction: 0.1}\n"
      "batch: {global: " + std::to_string(G) + ", per_gpu: 8, last_batch: pad}\n"
      "optim: {" + optim + ", base_batch: " + std::to_string(G) + ", warmup_steps: 2}\n"
      "dist: {shard: " + shard + "}\n"
      "train: {epochs: 3, seed: 5}\n",
      "shard_test.yaml");
}

/// Each rank's weights after 50 steps, unsharded and sharded, over every rank of
/// the job: within `tolerance` of max |w|. Bitwise equality is printed, not
/// asserted: it holds on this project's CPUs (every element takes the same
/// arithmetic in a piece as in its whole tensor), but a kernel that treats a
/// tensor's unaligned tail apart (scalar vs fused multiply-add) could differ by
/// an ulp at piece boundaries on another machine.
void expectShardedEqualsUnsharded(const std::string& optim, double tolerance,
                                  const std::string& backend = "gloo") {
  torch::Tensor plain, sharded;
  mpitest::inGroup(mpitest::worldSize(), [&](collective::Communicator& comm) {
    plain = trainSteps(shardConfig(optim, "none"), comm, 50);
    sharded = trainSteps(shardConfig(optim, "optimizer"), comm, 50,
                         testsupport::loadPlainData, [&](Trainer& t) {
                           auto* s = dynamic_cast<ShardedOptimizer*>(&t.update().optimizer());
                           ASSERT_NE(s, nullptr) << "dist.shard: optimizer built no sharded optimizer";
                           EXPECT_EQ(s->layout().total, 1067);
                           EXPECT_EQ(s->layout().slice, (1067 + comm.size() - 1) / comm.size());
                         });
  }, backend);
  ASSERT_TRUE(plain.defined() && sharded.defined());
  ASSERT_EQ(plain.numel(), 1067);
  const double diff = (sharded - plain).abs().max().item<double>();
  const double scale = plain.abs().max().item<double>();
  const bool bitwise = torch::equal(sharded, plain);
  EXPECT_LE(diff, tolerance * scale) << optim << " on " << mpitest::worldSize() << " ranks";
  std::printf("[ shard ] %s rank %d/%d %s: max |w_sharded - w| = %.3g (max |w| %.3g)%s\n",
              backend.c_str(), mpitest::worldRank(), mpitest::worldSize(), optim.c_str(), diff, scale,
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

}  // namespace
