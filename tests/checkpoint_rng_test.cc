// Note [rng records] with real ranks (each process its own generators): rng.pt
// written in chunks of one rank and in one chunk is the same file, and every
// rank resumes its own stream from it; on another world size it keeps its own.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "mpi_helpers.h"
#include "worker/common/console.h"
#include "worker/config/config.h"
#include "worker/model/model.h"
#include "worker/model/optimizer.h"
#include "worker/train/checkpoint/checkpoint.h"

using namespace batchdist;
using namespace batchdist::worker;
namespace fs = std::filesystem;

namespace {

/// These tests read the files right after save(): written in the foreground
/// (Note [background checkpoint]; the background's own test is in checkpoint_test.cc).
batchdist::worker::CheckpointConfig foreground(batchdist::worker::CheckpointConfig c) {
  c.background = false;
  return c;
}

std::string bytesOf(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST(CheckpointRng, EveryRankResumesItsOwnGeneratorFromRecordsGatheredInChunks) {
  const int world = mpitest::worldSize();
  const auto dir = mpitest::sharedScratchDir("mpi_rng_records") / "checkpoints";
  Config cfg = parseConfig("model: {hidden: [8], batchnorm: false}", "t.yaml");
  cfg.checkpoint.keep = 5;
  mpitest::inGroup(world, [&](collective::Communicator& comm) {
    torch::manual_seed(1);
    auto model = buildModel(cfg.model, {4}, 3);
    auto opt = makeOptimizer(cfg.optim, model->trainableParameters());
    CheckpointIdentity id;
    id.plan.global = 8 * world;
    id.plan.world_size = world;
    id.plan.steps_per_epoch = 10;
    id.config = cfg.resolved;
    Checkpointer ck(foreground(cfg.checkpoint), dir.string(), id, comm);
    const TrainState st{model.get(), opt.get(), nullptr, at::kCPU};
    Console quiet(false, ProgressStyle::kOff);
    torch::manual_seed(1000 + comm.rank());  // every rank a stream of its own
    torch::rand({7});
    TrainPosition pos;
    pos.global_step = 1;
    ck.setRngChunkBytes(1);  // one rank a chunk: W allreduces
    ASSERT_TRUE(ck.save(st, pos, false, quiet).error.empty());
    pos.global_step = 2;
    ck.setRngChunkBytes(std::size_t{1} << 20);  // all ranks in one chunk
    ASSERT_TRUE(ck.save(st, pos, false, quiet).error.empty());
    const auto next = torch::rand({5});  // what this rank draws after the checkpoint
    const auto one = verifyCheckpoint((dir / "step-00000001").string());
    const auto all = verifyCheckpoint((dir / "step-00000002").string());
    ASSERT_TRUE(one.problem.empty()) << one.problem;
    ASSERT_TRUE(all.problem.empty()) << all.problem;
    EXPECT_EQ(one.manifest.rng.value_or(RngLayout{}).chunk_ranks, 1);
    EXPECT_EQ(all.manifest.rng.value_or(RngLayout{}).chunk_ranks >= world, true);
    EXPECT_EQ(all.manifest.rng.value_or(RngLayout{}).ranks, world);
    EXPECT_EQ(bytesOf(dir / "step-00000001" / "rng.pt"), bytesOf(dir / "step-00000002" / "rng.pt"))
        << "the chunking changed rng.pt";

    torch::manual_seed(7);
    restoreState(one, st, comm.rank(), world);
    EXPECT_TRUE(torch::equal(torch::rand({5}), next)) << "rank " << comm.rank();
    // Another world size: this rank's stream is not another's; it keeps its own.
    torch::manual_seed(7);
    const auto own = torch::rand({5});
    torch::manual_seed(7);
    restoreState(all, st, comm.rank(), world + 1);
    EXPECT_TRUE(torch::equal(torch::rand({5}), own)) << "rank " << comm.rank();
    // The ranks' streams really differ (a record per rank, not rank 0's W times).
    auto gathered = comm.allgather(next.contiguous());
    if (world > 1) {
      EXPECT_FALSE(torch::equal(gathered[0], gathered[1]));
    }
    comm.barrier();
    if (comm.rank() == 0) fs::remove_all(dir);
  });
}
