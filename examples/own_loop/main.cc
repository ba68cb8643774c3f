// A program that keeps its own training loop and takes from batchdist the
// gradient sync (batchdist::DataParallel), the batch search on its own step
// (batchdist::searchBatch) and the equal shards (batchdist::EqualShards):
// docs/library.md, "Your own loop". Every rank trains on its own equal share of
// every global batch; the gradients are averaged while backward runs.
//   mpirun -np 2 own_loop [OUTPUT [STEPS]]
// Writes OUTPUT/params-rank<R>.pt (the module, torch::save) on every rank.
#include <batchdist/batchdist.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <string>

struct NetImpl : torch::nn::Module {
  NetImpl()
      : hidden(register_module("hidden", torch::nn::Linear(16, 64))),
        out(register_module("out", torch::nn::Linear(64, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return out(torch::relu(hidden(x))); }
  torch::nn::Linear hidden, out;
};
TORCH_MODULE(Net);

namespace F = torch::nn::functional;

int main(int argc, char** argv) {
  batchdist::Job job(argc, argv);  // first in main(): one process per GPU (or CPU rank)
  const std::string output = argc > 1 ? argv[1] : "own_loop-out";
  const int64_t steps = argc > 2 ? std::stoll(argv[2]) : 200;

  // The data: 4 clusters in 16 dimensions, the same on every rank.
  torch::manual_seed(1);
  const auto centres = torch::randn({4, 16}) * 2;
  const auto y = torch::randint(0, 4, {4100}, torch::kLong);
  const auto x = centres.index_select(0, y) + torch::randn({4100, 16});

  torch::manual_seed(job.rank() + 7);  // different starts: DataParallel takes rank 0's
  Net net;
  batchdist::DataParallel dp(job, net);
  const auto sgd = [&] { return torch::optim::SGD(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)); };
  // One step on this rank's share, micro-batch by micro-batch (`shards`: which samples).
  const auto step = [&](const batchdist::EqualShards& shards, int64_t s) {
    dp.zeroGrad();
    for (int64_t k = 0; k < shards.accumulation(); ++k) {
      const auto mb = shards.micro(s, k);
      const auto rows = torch::tensor(mb.indices);
      const auto losses = F::cross_entropy(net->forward(x.index_select(0, rows)), y.index_select(0, rows),
                                           F::CrossEntropyFuncOptions().reduction(torch::kNone));
      const auto loss = (losses * torch::tensor(mb.weights)).sum() * shards.lossScale(s);
      dp.beforeBackward(k + 1 == shards.accumulation());
      loss.backward();
    }
    return dp.sync();  // the gradients' mean over the ranks, and the agreed wishes
  };

  // The global batch is fixed; the search splits it per GPU x accumulation by samples/s.
  auto settings = batchdist::Settings().set("batch.global", 64).set("batch.last_batch", "pad");
  batchdist::BatchChoice choice;
  {
    auto trial = sgd();  // the trial steps' optimizer: the run's starts afresh below
    choice = batchdist::searchBatch(dp, x.size(0), [&](int64_t per_gpu, int64_t) {
      step(batchdist::EqualShards(dp, x.size(0), batchdist::Settings(settings).set("batch.per_gpu", per_gpu)), 0);
      trial.step();
    }, batchdist::Settings(settings).set("search.rounds", 1));
  }
  if (choice.stopped) return 128 + dp.stopSignal();
  auto optimizer = sgd();
  batchdist::EqualShards shards(dp, x.size(0), settings.set("batch.per_gpu", choice.per_gpu));

  for (int64_t done = 0, epoch = 0; done < steps; shards.setEpoch(++epoch)) {
    for (int64_t s = 0; s < shards.stepsPerEpoch() && done < steps; ++s, ++done) {
      const auto wishes = step(shards, s);
      optimizer.step();
      if (wishes.stop) return 128 + dp.stopSignal();  // every rank stops after the same step
    }
  }
  const auto losses = F::cross_entropy(net->forward(x), y);
  const auto accuracy = net->forward(x).argmax(1).eq(y).to(torch::kFloat).mean().item<double>();
  std::printf("rank %d: final loss %.4f, accuracy %.4f, backend %s, per-GPU %lld x %lld\n", job.rank(),
              losses.item<double>(), accuracy, dp.backend().c_str(), (long long)shards.perGpu(),
              (long long)shards.accumulation());
  std::filesystem::create_directories(output);
  torch::save(net, output + "/params-rank" + std::to_string(job.rank()) + ".pt");
  return 0;
}
