#pragma once
// batchdist as a C++ library: the launcher's whole run (rendezvous, the
// coordinated batch search, equal shards, lr scaling, overlapped gradient sync,
// out-of-memory back-off, checkpoints and resume on any world size, reports) for a
// program's own torch::nn::Module, loss function and data. docs/library.md.
//
//   int main(int argc, char** argv) {
//     batchdist::Job job(argc, argv);  // MPI: one process per GPU (mpirun, srun) or alone
//     auto net = std::make_shared<Net>();
//     auto data = std::make_shared<batchdist::TensorDataset>(x, y);
//     return job.train(net, [](Net& m, const torch::Tensor& x, const torch::Tensor& y) {
//       return batchdist::Loss(torch::nn::functional::cross_entropy(m.forward(x), y,
//           torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone)));
//     }, data, nullptr, batchdist::Settings().set("batch.global", 256));
//   }
//
// Stability: none before 1.0. These declarations may change in any 0.x release
// (the changelog in docs/library.md says how); the settings' keys follow
// README.md, Configuration. Everything outside this directory is private.

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

/// What libbatchdist.so exports: these declarations only (Note [library] in
/// launcher/CMakeLists.txt).
#define BATCHDIST_API __attribute__((visibility("default")))

namespace batchdist {

/// The keys of a batchdist config (README.md, Configuration), given in code: each set()
/// is the command line's --set key=value, and its messages name it so. Without
/// a file the config is these keys over the defaults.
class BATCHDIST_API Settings {
 public:
  Settings() = default;
  /// A YAML config file to start from (relative paths in it resolve against its
  /// directory); set() overrides its keys.
  static Settings fromFile(std::string path);
  /// `key` ("batch.global", "optim.lr", "data.name") set to `value`, read as YAML
  /// ("256", "auto", "[3, 32, 32]", "adamw").
  Settings& set(const std::string& key, const std::string& value);
  Settings& set(const std::string& key, const char* value) { return set(key, std::string(value)); }
  template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
  Settings& set(const std::string& key, T value) {
    if constexpr (std::is_same_v<T, bool>) {
      return set(key, std::string(value ? "true" : "false"));
    } else if constexpr (std::is_integral_v<T>) {
      return set(key, std::to_string(value));
    } else {
      return set(key, number(static_cast<double>(value)));
    }
  }
  const std::string& file() const { return file_; }
  /// "key=value", in the order set.
  const std::vector<std::string>& entries() const { return entries_; }

 private:
  static std::string number(double v);
  std::string file_;
  std::vector<std::string> entries_;
};

/// How a run starts and where it writes: the command line's options.
struct RunOptions {
  std::string output = "batchdist-out";  ///< --output: report.json/html, model.pt, checkpoints/
  std::string resume;       ///< --resume: "auto" (the newest checkpoint, if any), a path, or ""
  bool quiet = false;       ///< -q: no progress lines on rank 0
  bool research = false;    ///< --research: ignore the search cache
  bool search_only = false; ///< the `search` verb: search, print the plan, stop
  std::string report;       ///< --report PATH: a copy of report.json
};

/// One example, or a batch of them stacked (x [n, ...], target [n, ...]).
struct Example {
  torch::Tensor x;
  torch::Tensor target;
};

/// A program's own data set. get() is called with a micro-batch's indices, on
/// the training thread, or on data.workers threads at once when data.workers > 0
/// (then it must be safe to call concurrently). x and target reach the loss
/// function as get() returns them, moved to the rank's device.
class BATCHDIST_API Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Example get(int64_t index) const = 0;
  /// The examples `indices`, stacked. By default get() of each, then torch::stack.
  virtual Example get(const std::vector<int64_t>& indices) const;
};

/// Whole tensors in memory: example i is {x[i], target[i]}. Gathered a
/// micro-batch at once, like batchdist's own in-memory sets.
class BATCHDIST_API TensorDataset final : public Dataset {
 public:
  TensorDataset(torch::Tensor x, torch::Tensor target);
  int64_t size() const override { return x_.size(0); }
  Example get(int64_t index) const override { return {x_[index], target_[index]}; }
  Example get(const std::vector<int64_t>& indices) const override;
  const torch::Tensor& x() const { return x_; }
  const torch::Tensor& target() const { return target_; }

 private:
  torch::Tensor x_, target_;
};

/// What a loss function returns for a batch of n examples: the loss, either one
/// per example ([n], float; required where the last batch is padded, whose
/// padding weighs 0: batch.last_batch: pad) or the batch's mean (0-d), and named
/// metrics (each the batch's mean, 0-d), the same names every time. batchdist
/// weighs, sums and normalises the loss over the global batch itself.
struct Loss {
  Loss(torch::Tensor value) : value(std::move(value)) {}  // NOLINT: a bare tensor is a Loss
  Loss(torch::Tensor value, std::vector<std::pair<std::string, torch::Tensor>> metrics)
      : value(std::move(value)), metrics(std::move(metrics)) {}
  torch::Tensor value;
  std::vector<std::pair<std::string, torch::Tensor>> metrics;
};

/// The loss of module on a batch (x, target), its forward run here.
using LossFunction =
    std::function<Loss(torch::nn::Module& module, const torch::Tensor& x, const torch::Tensor& target)>;

/// This process's place in a data-parallel job: one process per GPU, started by
/// mpirun or srun (or alone: a job of one). One Job per process; its calls are
/// collective: every rank makes the same ones, in the same order.
class BATCHDIST_API Job {
 public:
  /// Initialises MPI (MPI_THREAD_FUNNELED: batchdist's calls come from this
  /// thread) and finalises it at destruction. Make it first in main(): when this
  /// process's std::filesystem calls bind to a pip LibTorch's private copy rather
  /// than libstdc++.so.6 (docs/library.md, "One libstdc++"), it starts the program
  /// again, once, with libstdc++.so.6 preloaded (BATCHDIST_STDLIB_GUARD=off: never).
  Job(int& argc, char**& argv);
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  int rank() const;
  int size() const;
  /// The rank among those on this host (the GPU it trains on).
  int localRank() const;

  /// Trains the model and data `settings` describe: what `batchdist train` does.
  int train(const Settings& settings, const RunOptions& options = {});

  /// Trains the program's `module` with `loss` (called as loss(M&, x, target))
  /// on `train_set`; `val_set` (may be null: then data.val_fraction of
  /// train_set is held out, seeded) is evaluated each epoch. The module's state
  /// as handed over is every rank's start (rank 0's is broadcast); the search's
  /// trial steps do not reach it. After the run the module holds the trained
  /// weights; rank 0 also writes them to OUTPUT/model.pt (torch::save) and
  /// checkpoints, which resume into a module of the same type.
  /// Returns the exit code the batchdist command would: 0 (done), 2 (bad
  /// settings or data, said by the lowest failing rank), 128 + signal (a stop
  /// asked by SIGTERM, SIGUSR1 or SIGINT, checkpointed: run again with
  /// options.resume = "auto"). A failure during the run (a rank's error, a lost
  /// rank) ends the whole job, as the command does, after the failing rank's
  /// message.
  template <typename M, typename F>
  int train(std::shared_ptr<M> module, F loss, std::shared_ptr<const Dataset> train_set,
            std::shared_ptr<const Dataset> val_set, const Settings& settings,
            const RunOptions& options = {}) {
    return run(std::move(module), wrap<M>(std::move(loss)), std::move(train_set),
               std::move(val_set), settings, options);
  }
  template <typename M, typename F>
  int train(const torch::nn::ModuleHolder<M>& module, F loss,
            std::shared_ptr<const Dataset> train_set, std::shared_ptr<const Dataset> val_set,
            const Settings& settings, const RunOptions& options = {}) {
    return train(module.ptr(), std::move(loss), std::move(train_set), std::move(val_set),
                 settings, options);
  }
  /// The program's module and loss on one of batchdist's data sets (data.name
  /// in `settings`: npy, tokens, image_folder, ...; docs/data.md).
  template <typename M, typename F>
  int train(std::shared_ptr<M> module, F loss, const Settings& settings,
            const RunOptions& options = {}) {
    return run(std::move(module), wrap<M>(std::move(loss)), nullptr, nullptr, settings, options);
  }
  template <typename M, typename F>
  int train(const torch::nn::ModuleHolder<M>& module, F loss, const Settings& settings,
            const RunOptions& options = {}) {
    return train(module.ptr(), std::move(loss), settings, options);
  }

 private:
  template <typename M, typename F>
  static LossFunction wrap(F loss) {
    return [loss = std::move(loss)](torch::nn::Module& m, const torch::Tensor& x,
                                    const torch::Tensor& target) -> Loss {
      // dynamic: torch::nn::Module is a virtual base of Cloneable<...> modules.
      return loss(dynamic_cast<M&>(m), x, target);
    };
  }
  int run(std::shared_ptr<torch::nn::Module> module, LossFunction loss,
          std::shared_ptr<const Dataset> train_set, std::shared_ptr<const Dataset> val_set,
          const Settings& settings, const RunOptions& options);

  friend class DataParallel;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// DataParallel's settings: the dist.* keys of a run (README.md, Configuration).
struct DataParallelOptions {
  std::string backend = "auto";  ///< dist.backend: auto (nccl on CUDA, else gloo or mpi), gloo, nccl, mpi
  double bucket_mb = 25;         ///< dist.bucket_mb: gradients sent per allreduce
  double timeout_s = 300;        ///< dist.timeout_s: a collective that takes longer fails
  std::string interface;         ///< dist.interface: the network interface ("" = the host's)
};

/// What a step asks of every rank. Any rank's wish is every rank's, at the same
/// step, and travels inside the gradient allreduce (no extra collective).
struct StepWishes {
  bool stop = false;        ///< end after this step; also set by SIGTERM, SIGUSR1 or SIGINT
  bool checkpoint = false;  ///< save a checkpoint after this step
};

/// Data parallelism for a program's own training loop: the launcher's gradient
/// sync (Note [overlapped reducer]) on the program's module. The constructor
/// joins the process group (NCCL on CUDA, else Gloo or MPI; on the device of the
/// module's parameters), overwrites every rank's parameters and buffers with rank
/// 0's, and makes each parameter's gradient a view into the buckets the
/// allreduce sends, started by autograd hooks while backward still runs. A step:
///
///   dp.zeroGrad();                       // not the optimizer's zero_grad()
///   auto loss = ...;                     // this rank's share of the batch
///   dp.beforeBackward();                 // (false for all but the last micro-batch)
///   loss.backward();
///   auto wishes = dp.sync();             // gradients: the mean over the ranks
///   optimizer.step();
///   if (wishes.stop) break;
///
/// Collective: every rank makes the same calls, in the same order, for the same
/// parameters (shape, dtype, order). The module must not change its parameters
/// while the DataParallel lives. Also installs batchdist's stop handlers
/// (SIGTERM, SIGUSR1, SIGINT ask for a stop that sync() agrees on).
class BATCHDIST_API DataParallel {
 public:
  DataParallel(Job& job, torch::nn::Module& module, const DataParallelOptions& options = {});
  template <typename M>
  DataParallel(Job& job, const torch::nn::ModuleHolder<M>& module,
               const DataParallelOptions& options = {})
      : DataParallel(job, *module.ptr(), options) {}
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  /// Zeroes every gradient, keeping it a view of its bucket (an optimizer's
  /// zero_grad() that drops them is caught by beforeBackward(), which re-attaches).
  void zeroGrad();
  /// Before each micro-batch's backward: `last` for the final one of the step
  /// (only its gradients are sent; the others accumulate locally).
  void beforeBackward(bool last = true);
  /// After the last micro-batch's backward: waits for the allreduce, divides the
  /// sums by the number of ranks, and returns the step's agreed wishes (`mine`:
  /// this rank's). Every rank calls it every step.
  StepWishes sync(const StepWishes& mine = {});
  /// The stop signal this rank received (SIGTERM, SIGUSR1, SIGINT), or 0.
  int stopSignal() const;
  /// The backend the process group runs on: "nccl", "gloo" or "mpi".
  std::string backend() const;

 private:
  friend struct DataParallelAccess;  // searchBatch(), EqualShards
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A micro-batch of a rank: the data set's indices and each sample's weight in
/// the loss (1, or 0 for padding).
struct MicroBatch {
  std::vector<int64_t> indices;
  std::vector<float> weights;
};

/// The launcher's equal shards (Note [equal shards], docs/data.md) for a program's
/// own loop: every epoch one seeded permutation of the data set, the same on every
/// rank, cut into global batches G = per-GPU batch m x accumulation a x ranks W;
/// every rank gets exactly a micro-batches of exactly m samples per step. The
/// short tail of an epoch is dropped (batch.last_batch: drop) or the last global
/// batch is filled with samples of weight 0 (pad); with BatchNorm in the module
/// no micro-batch has fewer than batch.min_per_gpu (2) samples, and `keep` is
/// refused. Keys read from `settings`: batch.global, batch.per_gpu (or
/// batch.accum), batch.last_batch, batch.min_per_gpu, train.seed (README.md, Configuration);
/// a bad value throws std::invalid_argument with the launcher's message, on
/// every rank alike. No communication.
///
///   batchdist::EqualShards shards(dp, data.size(), settings);
///   for (int64_t s = 0; s < shards.stepsPerEpoch(); ++s) {
///     dp.zeroGrad();
///     for (int64_t k = 0; k < shards.accumulation(); ++k) {
///       auto mb = shards.micro(s, k);  // this rank's
///       auto loss = (per_sample_loss(mb.indices) * weights(mb)).sum() * shards.lossScale(s);
///       dp.beforeBackward(k + 1 == shards.accumulation());
///       loss.backward();
///     }
///     dp.sync();
///     optimizer.step();
///   }
class BATCHDIST_API EqualShards {
 public:
  EqualShards(const DataParallel& dp, int64_t dataset_size, const Settings& settings);
  ~EqualShards();
  EqualShards(EqualShards&&) noexcept;
  EqualShards& operator=(EqualShards&&) noexcept;

  int64_t globalBatch() const;
  int64_t perGpu() const;
  int64_t accumulation() const;
  int64_t stepsPerEpoch() const;
  /// Samples an epoch leaves out (drop) or adds with weight 0 (pad).
  int64_t droppedPerEpoch() const;
  int64_t paddedPerEpoch() const;
  /// The permutation of `epoch` (0 at construction).
  void setEpoch(int64_t epoch);
  /// This rank's micro-batch `k` (0 <= k < accumulation()) of step `step`
  /// (0 <= step < stepsPerEpoch()) of the current epoch.
  MicroBatch micro(int64_t step, int64_t k = 0) const;
  /// Samples of weight 1 in step `step` over all ranks: the loss's denominator.
  int64_t realSamples(int64_t step) const;
  /// What a micro-batch's summed, weighted per-sample loss is multiplied by so
  /// that DataParallel::sync()'s mean over the ranks is the mean over the step's
  /// real samples: ranks / realSamples(step).
  double lossScale(int64_t step) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// One optimizer step of a program's loop at per-GPU micro-batch `per_gpu` and
/// `accumulation` micro-batches: dp.zeroGrad(); per micro-batch forward,
/// dp.beforeBackward(last), backward; dp.sync() once; the optimizer's step.
using StepFunction = std::function<void(int64_t per_gpu, int64_t accumulation)>;

/// What searchBatch() chose, agreed by every rank.
struct BatchChoice {
  int64_t per_gpu = 0;        ///< 0 when stopped
  int64_t accumulation = 1;
  int64_t global = 0;         ///< per_gpu x accumulation x ranks
  double samples_per_s = 0;   ///< the job's: ranks x the slowest rank's
  std::string why;            ///< the rule's sentence, as the launcher prints it
  /// A stop was asked during the search (SIGTERM, SIGUSR1 or SIGINT on any rank,
  /// dp.stopSignal() on the one that received it): every rank ends it after the
  /// same candidate and nothing is chosen.
  bool stopped = false;
};

/// The launcher's coordinated batch search (docs/batch-search.md) on the program's own
/// step: every rank times candidate per-GPU batches with `step`, an out-of-memory
/// on any rank fails the candidate on all (the failing rank's gradients are sent
/// as zeros, so no rank waits), and the ranks pick by samples/s (the slowest
/// rank's x ranks) within search.tolerance. Keys read from `settings`: batch.global
/// (fixed: the search splits it into per-GPU x accumulation; unset: accumulation
/// 1, the global batch follows), batch.min_per_gpu and search.* (min, max,
/// multiple_of, memory_fraction, memory_limit_mb, timing, rounds, objective,
/// tolerance). Rank 0 prints the launcher's search lines and table
/// (train.progress: off: none). The step must make no collective but
/// dp.sync(), once per call. The module's parameters and buffers are put back
/// as they were afterwards; an optimizer's state is not: make it after the
/// search, or accept the trial steps in it. Collective. Throws
/// std::invalid_argument for bad settings and std::runtime_error when no
/// candidate fits, on every rank alike.
BATCHDIST_API BatchChoice searchBatch(DataParallel& dp, int64_t dataset_size,
                                      const StepFunction& step, const Settings& settings = {});

}  // namespace batchdist
