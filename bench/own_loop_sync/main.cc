// Benchmark, not a test: batchdist::DataParallel against the loop LibTorch C++
// users write today without it: after backward, one blocking MPI_Allreduce per
// parameter's gradient (no overlap with backward, no buckets), then divide by the
// world size. Same MLP, data, optimizer and per-rank batch in every mode; each
// rank trains on its own fixed synthetic batch (throughput only, not learning).
//   mpirun -np 2 own_loop_sync --sync naive|gloo|mpi --steps N --warmup K
//                              [--width W --depth D --batch B]
// Defaults: DEPTH 8 Linear layers of WIDTH 1024 and a 10-way head (8.4 M parameters,
// 33.6 MB of gradients a step), BATCH 128 a rank (~80 ms of forward+backward on one
// core of this 2-core EPYC), STEPS 30, WARMUP 5.
// Rank 0 prints one line: mode, median step time, samples/s (global batch / median
// step), the medians of forward+backward and of the sync part, the gradients' size,
// and params_equal (every rank's parameters bit-identical to rank 0's at the end).
// Run by bench/own_loop_sync.sh.
#include <batchdist/batchdist.h>
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t width, int64_t depth, int64_t classes) {
    for (int64_t i = 0; i < depth; ++i) {
      hidden.push_back(register_module("hidden" + std::to_string(i), torch::nn::Linear(width, width)));
    }
    out = register_module("out", torch::nn::Linear(width, classes));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& layer : hidden) x = torch::relu(layer(x));
    return out(x);
  }
  std::vector<torch::nn::Linear> hidden;
  torch::nn::Linear out{nullptr};
};
TORCH_MODULE(Mlp);

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The largest |p - p on rank 0| over every parameter and rank.
double maxDiffToRank0(Mlp& net) {
  double diff = 0;
  for (const auto& p : net->parameters()) {
    auto ref = p.detach().clone();
    MPI_Bcast(ref.data_ptr<float>(), static_cast<int>(ref.numel()), MPI_FLOAT, 0, MPI_COMM_WORLD);
    diff = std::max(diff, (p.detach() - ref).abs().max().item<double>());
  }
  MPI_Allreduce(MPI_IN_PLACE, &diff, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return diff;
}

}  // namespace

int main(int argc, char** argv) {
  batchdist::Job job(argc, argv);  // first in main(): initialises MPI
  std::map<std::string, std::string> opt{{"--sync", ""}, {"--steps", "30"}, {"--warmup", "5"},
                                         {"--width", "1024"}, {"--depth", "8"}, {"--batch", "128"}};
  bool ok = argc % 2 == 1;  // --key value pairs
  for (int i = 1; ok && i < argc; i += 2) {
    const auto it = opt.find(argv[i]);
    ok = it != opt.end();
    if (ok) it->second = argv[i + 1];
  }
  const std::string mode = opt["--sync"];
  if (!ok || (mode != "naive" && mode != "gloo" && mode != "mpi")) {
    if (job.rank() == 0) {
      std::fprintf(stderr, "usage: own_loop_sync --sync naive|gloo|mpi [--steps N] [--warmup K] "
                           "[--width W] [--depth D] [--batch B]\n");
    }
    return 2;
  }
  const int64_t steps = std::stoll(opt["--steps"]), warmup = std::stoll(opt["--warmup"]);
  const int64_t width = std::stoll(opt["--width"]), depth = std::stoll(opt["--depth"]);
  const int64_t batch = std::stoll(opt["--batch"]), classes = 10, world = job.size();
  if (steps < 1) {
    if (job.rank() == 0) std::fprintf(stderr, "own_loop_sync: --steps must be at least 1\n");
    return 2;
  }
  torch::set_num_threads(1);  // one core per rank

  torch::manual_seed(1);  // the same data and start on every rank
  const auto x = torch::randn({world * batch, width}).chunk(world)[job.rank()];  // this rank's share
  const auto y = torch::randint(0, classes, {world * batch}, torch::kLong).chunk(world)[job.rank()];
  Mlp net(width, depth, classes);
  std::unique_ptr<batchdist::DataParallel> dp;
  if (mode != "naive") {
    dp = std::make_unique<batchdist::DataParallel>(job, net, batchdist::DataParallelOptions{mode});
  }
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  double grad_mb = 0;
  for (const auto& p : net->parameters()) grad_mb += p.numel() * 4 / 1e6;

  std::vector<double> step_s, backward_s, sync_s;
  for (int64_t step = 0; step < warmup + steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    if (dp) {
      dp->zeroGrad();
    } else {
      optimizer.zero_grad();
    }
    const auto loss = torch::nn::functional::cross_entropy(net->forward(x), y);
    if (dp) dp->beforeBackward();
    loss.backward();
    const auto t1 = std::chrono::steady_clock::now();
    if (dp) {
      dp->sync();
    } else {
      for (const auto& p : net->parameters()) {
        auto g = p.grad();
        MPI_Allreduce(MPI_IN_PLACE, g.data_ptr<float>(), static_cast<int>(g.numel()), MPI_FLOAT,
                      MPI_SUM, MPI_COMM_WORLD);
        g.div_(world);
      }
    }
    const auto t2 = std::chrono::steady_clock::now();
    optimizer.step();
    const auto t3 = std::chrono::steady_clock::now();
    if (step >= warmup) {
      step_s.push_back(seconds(t0, t3));
      backward_s.push_back(seconds(t0, t1));
      sync_s.push_back(seconds(t1, t2));
    }
  }

  const bool equal = maxDiffToRank0(net) == 0;
  if (job.rank() == 0) {
    const double step_median = median(step_s);
    std::printf("mode=%s steps=%lld median_step_s=%.5f samples_per_s=%.1f backward_s=%.5f sync_s=%.5f "
                "grad_mb=%.1f params_equal=%d\n",
                mode.c_str(), (long long)steps, step_median, world * batch / step_median,
                median(backward_s), median(sync_s), grad_mb, equal ? 1 : 0);
  }
  return 0;
}
