// The library's own-loop calls on real ranks (mpirun -np 2 and 3), through the
// public header alone: batchdist::EqualShards (Note [equal shards]) and
// batchdist::searchBatch on a program's step (Note [search agreement]: a rank
// whose step runs out of memory, fails or misuses sync() never strands the
// others). One Job and one DataParallel for the whole binary (one per process);
// the agreed stop runs last, as its signal stays set.
#include <batchdist/batchdist.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <csignal>
#include <cstdio>
#include <functional>
#include <memory>
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

batchdist::Job* g_job = nullptr;

struct NetImpl : torch::nn::Module {
  NetImpl() : fc(register_module("fc", torch::nn::Linear(8, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc(x); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Net);

/// The binary's one module and DataParallel (rank 0's weights everywhere).
struct Shared {
  Shared() : net(), dp(*g_job, net) {}
  Net net;
  batchdist::DataParallel dp;
};
std::unique_ptr<Shared> g_shared;  // gone before the Job (main)
Shared& shared() {
  if (!g_shared) g_shared = std::make_unique<Shared>();
  return *g_shared;
}

int rank() { return g_job->rank(); }
int world() { return g_job->size(); }

std::vector<int64_t> allGather(const std::vector<int64_t>& mine) {
  const int n = static_cast<int>(mine.size());
  std::vector<int> counts(world());
  MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::vector<int> offsets(world(), 0);
  for (int r = 1; r < world(); ++r) offsets[r] = offsets[r - 1] + counts[r - 1];
  std::vector<int64_t> all(offsets.back() + counts.back());
  MPI_Allgatherv(mine.data(), n, MPI_INT64_T, all.data(), counts.data(), offsets.data(),
                 MPI_INT64_T, MPI_COMM_WORLD);
  return all;
}

/// A real step of the shared module: forward, backward, sync, SGD by hand.
void realStep(int64_t per_gpu, int64_t accumulation) {
  auto& s = shared();
  s.dp.zeroGrad();
  for (int64_t k = 0; k < accumulation; ++k) {
    const auto x = torch::randn({per_gpu, 8});
    const auto loss = s.net->forward(x).pow(2).mean();
    s.dp.beforeBackward(k + 1 == accumulation);
    loss.backward();
  }
  s.dp.sync();
  torch::NoGradGuard no_grad;
  for (auto& p : s.net->parameters()) p.sub_(0.01 * p.grad());
}

batchdist::Settings quickSearch() {
  return batchdist::Settings()
      .set("search.min", 2)
      .set("search.multiple_of", 2)
      .set("search.max_time_s", 0.05)
      .set("search.min_time_s", 0.01)
      .set("search.rounds", 1)
      .set("train.progress", "off");
}

std::string messageOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

TEST(EqualShards, EveryRankTheSameCountAndPadCoversTheEpochOnce) {
  constexpr int64_t kN = 23;
  const int64_t global = 4 * world();
  batchdist::EqualShards shards(shared().dp, kN,
                                batchdist::Settings()
                                    .set("batch.global", global)
                                    .set("batch.per_gpu", 2)
                                    .set("batch.last_batch", "pad")
                                    .set("train.seed", 5));
  EXPECT_EQ(shards.accumulation(), 2);
  EXPECT_EQ(shards.stepsPerEpoch(), (kN + global - 1) / global);
  EXPECT_EQ(shards.paddedPerEpoch(), shards.stepsPerEpoch() * global - kN);
  for (int64_t epoch : {0, 1}) {
    shards.setEpoch(epoch);
    std::vector<int64_t> real;
    int64_t weight_sum = 0;
    for (int64_t s = 0; s < shards.stepsPerEpoch(); ++s) {
      for (int64_t k = 0; k < shards.accumulation(); ++k) {
        const auto mb = shards.micro(s, k);
        ASSERT_EQ(mb.indices.size(), 2u);  // exactly per-GPU, also in the padded step
        for (std::size_t i = 0; i < mb.indices.size(); ++i) {
          if (mb.weights[i] > 0) real.push_back(mb.indices[i]);
          weight_sum += mb.weights[i] > 0 ? 1 : 0;
        }
      }
      EXPECT_DOUBLE_EQ(shards.lossScale(s), static_cast<double>(world()) / shards.realSamples(s));
    }
    const auto all = allGather(real);
    EXPECT_EQ(all.size(), static_cast<std::size_t>(kN));
    EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), static_cast<std::size_t>(kN));
  }
}

TEST(EqualShards, DropLeavesTheTailOutAndEpochsDiffer) {
  constexpr int64_t kN = 50;
  batchdist::EqualShards shards(shared().dp, kN, batchdist::Settings().set("batch.global", 6 * world()));
  EXPECT_EQ(shards.perGpu(), 6);
  EXPECT_EQ(shards.stepsPerEpoch(), kN / (6 * world()));
  EXPECT_EQ(shards.droppedPerEpoch(), kN % (6 * world()));
  const auto first = shards.micro(0).indices;
  shards.setEpoch(1);
  EXPECT_NE(shards.micro(0).indices, first);
  EXPECT_THROW(shards.micro(shards.stepsPerEpoch()), std::out_of_range);
}

TEST(EqualShards, BadSettingsSayWhatTheLauncherSays) {
  const auto make = [](batchdist::Settings s) {
    return [s] { batchdist::EqualShards(shared().dp, 100, s); };
  };
  const std::string odd = messageOf(make(batchdist::Settings().set("batch.global", 2 * world() + 1)));
  EXPECT_NE(odd.find("batchdist::EqualShards: batch.global=" + std::to_string(2 * world() + 1) +
                     " is not divisible by world size " + std::to_string(world())),
            std::string::npos)
      << odd;
  EXPECT_NE(messageOf(make(batchdist::Settings().set("batch.globl", 8))).find("batch.global"),
            std::string::npos);
  EXPECT_NE(messageOf(make(batchdist::Settings().set("batch.per_gpu", "auto"))).find("searchBatch()"),
            std::string::npos);
  EXPECT_NE(messageOf(make(batchdist::Settings())).find("set batch.global"), std::string::npos);
  const std::string negative = messageOf(make(batchdist::Settings().set("batch.global", -64)));
  EXPECT_NE(negative.find("Settings::set(\"batch.global\"): must be >= 1, got -64"), std::string::npos)
      << negative;
  EXPECT_NE(messageOf(make(batchdist::Settings().set("batch.global", 64 * world())))
                .find("so batch.last_batch: drop leaves no step"),
            std::string::npos);
}

TEST(SearchBatch, ChoosesTheSameSplitEverywhereAndLeavesTheModuleAsItWas) {
  const auto before = shared().net->fc->weight.clone();
  const auto choice = batchdist::searchBatch(shared().dp, 4096, realStep,
                                             quickSearch().set("batch.global", 8 * world()));
  EXPECT_FALSE(choice.stopped);
  EXPECT_EQ(choice.global, 8 * world());
  EXPECT_EQ(choice.per_gpu * choice.accumulation, 8);
  EXPECT_GT(choice.samples_per_s, 0);
  EXPECT_NE(choice.why.find("samples/s"), std::string::npos) << choice.why;
  const auto all = allGather({choice.per_gpu, choice.accumulation});
  for (int r = 1; r < world(); ++r) {
    EXPECT_EQ(all[2 * r], all[0]);
    EXPECT_EQ(all[2 * r + 1], all[1]);
  }
  EXPECT_TRUE(torch::equal(shared().net->fc->weight, before));
}

TEST(SearchBatch, AnOutOfMemoryOnOneRankFailsTheCandidateOnAll) {
  // The last rank runs out of memory above per-GPU 4: at the start of the step,
  // or after backward (buckets in flight), alternately; nobody waits.
  int calls = 0;
  const auto step = [&](int64_t per_gpu, int64_t accumulation) {
    if (rank() == world() - 1 && per_gpu > 4 && ++calls % 2 == 1) throw std::bad_alloc();
    if (rank() == world() - 1 && per_gpu > 4) {
      auto& s = shared();
      s.dp.zeroGrad();
      s.dp.beforeBackward();
      s.net->forward(torch::randn({per_gpu, 8})).sum().backward();
      throw std::runtime_error("CUDA out of memory. Tried to allocate 2.00 GiB");
    }
    realStep(per_gpu, accumulation);
  };
  const auto choice = batchdist::searchBatch(shared().dp, 4096, step,
                                             quickSearch().set("search.min", 4).set("search.max", 16));
  EXPECT_EQ(calls, rank() == world() - 1 ? 2 : 0);  // 8, then 6: one step each, then agreed
  EXPECT_EQ(choice.per_gpu, 4);  // the only size that fits on every rank
  EXPECT_EQ(choice.accumulation, 1);
  for (const auto m : allGather({choice.per_gpu})) EXPECT_EQ(m, 4);
}

TEST(SearchBatch, AFailingStepEndsTheSearchOnEveryRank) {
  const auto step = [](int64_t per_gpu, int64_t accumulation) {
    if (rank() == world() - 1 && per_gpu >= 4) throw std::logic_error("the program's bug\nmore");
    realStep(per_gpu, accumulation);
  };
  const std::string what = messageOf([&] { batchdist::searchBatch(shared().dp, 4096, step, quickSearch()); });
  EXPECT_NE(what.find("batchdist::searchBatch: batch search: per-GPU batch 4 failed on rank " +
                      std::to_string(world() - 1)),
            std::string::npos)
      << what;
  if (rank() == world() - 1) EXPECT_NE(what.find(": the program's bug"), std::string::npos) << what;
}

TEST(SearchBatch, AStepMustSyncOnce) {
  const auto twice = [](int64_t per_gpu, int64_t accumulation) {
    realStep(per_gpu, accumulation);
    shared().dp.sync();
  };
  const std::string what = messageOf([&] { batchdist::searchBatch(shared().dp, 4096, twice, quickSearch()); });
  EXPECT_NE(what.find("failed on rank 0"), std::string::npos) << what;
  if (rank() == 0) EXPECT_NE(what.find("called DataParallel::sync() 2 times"), std::string::npos) << what;
}

TEST(SearchBatch, BadSettingsAndArguments) {
  EXPECT_NE(messageOf([] { batchdist::searchBatch(shared().dp, 4096, {}, quickSearch()); })
                .find("the step function is empty"),
            std::string::npos);
  EXPECT_NE(messageOf([] { batchdist::searchBatch(shared().dp, 0, realStep, quickSearch()); })
                .find("the data set has 0 samples"),
            std::string::npos);
  EXPECT_NE(messageOf([] {
              batchdist::searchBatch(shared().dp, 4096, realStep, quickSearch().set("dist.shard", "optimizer"));
            }).find("the launcher's levers"),
            std::string::npos)
      << messageOf([] {
           batchdist::searchBatch(shared().dp, 4096, realStep, quickSearch().set("dist.shard", "optimizer"));
         });
  EXPECT_NE(messageOf([] {
              batchdist::searchBatch(shared().dp, 4096, realStep,
                                     quickSearch().set("search.tolerance", "lots"));
            }).find("search.tolerance"),
            std::string::npos);
}

// Last: the signal stays set for the rest of the process.
TEST(ZAgreedStop, ASignalOnOneRankStopsEveryRankAfterTheSameStep) {
  int64_t steps = 0;
  for (;; ++steps) {
    if (rank() == world() - 1 && steps == 3) std::raise(SIGUSR1);
    auto& s = shared();
    s.dp.zeroGrad();
    const auto loss = s.net->forward(torch::randn({2, 8})).sum();
    s.dp.beforeBackward();
    loss.backward();
    if (s.dp.sync().stop) break;
    ASSERT_LT(steps, 100) << "the stop was never agreed";
  }
  const auto all = allGather({steps});
  for (const auto n : all) EXPECT_EQ(n, 3);
  EXPECT_EQ(shared().dp.stopSignal(), rank() == world() - 1 ? SIGUSR1 : 0);
  const auto choice = batchdist::searchBatch(shared().dp, 4096, realStep, quickSearch());
  EXPECT_TRUE(choice.stopped);
  EXPECT_EQ(choice.per_gpu, 0);
}

}  // namespace

int main(int argc, char** argv) {
  batchdist::Job job(argc, argv);
  g_job = &job;
  ::testing::InitGoogleTest(&argc, argv);
  if (job.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed) std::fprintf(stderr, "rank %d: tests failed\n", job.rank());
  g_shared.reset();
  return any;
}
