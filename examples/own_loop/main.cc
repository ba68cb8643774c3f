// A program that keeps its own training loop and hands batchdist only the
// gradient sync: batchdist::DataParallel (docs/library.md, "Your own loop").
// Each rank trains on its own equal share of every batch; the gradients are
// averaged over the ranks while backward runs, so every rank takes the same step.
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

int main(int argc, char** argv) {
  batchdist::Job job(argc, argv);  // first in main(): one process per GPU (or CPU rank)
  const std::string output = argc > 1 ? argv[1] : "own_loop-out";
  const int64_t steps = argc > 2 ? std::stoll(argv[2]) : 200;
  const int64_t global = 64, per_rank = global / job.size();  // equal shares (W divides 64)

  // The data: 4 clusters in 16 dimensions, the same on every rank.
  torch::manual_seed(1);
  const auto centres = torch::randn({4, 16}) * 2;
  const auto y = torch::randint(0, 4, {4096}, torch::kLong);
  const auto x = centres.index_select(0, y) + torch::randn({4096, 16});

  torch::manual_seed(job.rank() + 7);  // different starts: DataParallel takes rank 0's
  Net net;
  batchdist::DataParallel dp(job, net);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  double loss_value = 0;
  for (int64_t step = 0; step < steps; ++step) {
    // This rank's share of the step's global batch: rows rank, rank + W, ...
    const int64_t first = step * global % x.size(0);
    const auto rows = torch::arange(first + job.rank(), first + global, job.size());
    dp.zeroGrad();
    const auto loss = torch::nn::functional::cross_entropy(net->forward(x.index_select(0, rows)),
                                                           y.index_select(0, rows));
    dp.beforeBackward();
    loss.backward();
    const auto wishes = dp.sync();  // the gradients' mean over the ranks
    optimizer.step();
    loss_value = loss.item<double>();
    if (job.rank() == 0 && (step + 1) % 50 == 0) std::printf("step %lld loss %.4f\n", (long long)step + 1, loss_value);
    if (wishes.stop) break;  // SIGTERM on any rank: every rank stops after the same step
  }
  const auto accuracy = net->forward(x).argmax(1).eq(y).to(torch::kFloat).mean().item<double>();
  std::printf("rank %d: final loss %.4f, accuracy %.4f, backend %s, per-rank batch %lld\n", job.rank(),
              loss_value, accuracy, dp.backend().c_str(), (long long)per_rank);
  std::filesystem::create_directories(output);
  torch::save(net, output + "/params-rank" + std::to_string(job.rank()) + ".pt");
  return 0;
}
