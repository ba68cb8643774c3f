#pragma once
// The training loop: plan -> micro-batches -> forward/backward -> gradient sum ->
// optimizer, with distributed evaluation and per-epoch health checks.

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "collective/grad_sync.h"
#include "worker/config.h"
#include "worker/data.h"
#include "worker/model.h"
#include "worker/plan.h"

namespace batchdist::worker {

/// Rank-0 console output: transient status lines on a terminal, plain lines otherwise.
class Console {
 public:
  Console(bool enabled, bool tty) : enabled_(enabled), tty_(tty) {}
  bool enabled() const { return enabled_; }
  /// A line that stays.
  void line(const std::string& s);
  /// A progress line: overwritten in place on a terminal, printed every few seconds otherwise.
  void status(const std::string& s);

 private:
  bool enabled_;
  bool tty_;
  bool pending_ = false;
  double last_plain_ = -1e9;
};

struct EpochStats {
  int64_t epoch = 0;
  double train_loss = 0;
  double eval_loss = 0;
  double eval_accuracy = 0;
  double samples_per_s = 0;
  double seconds = 0;
};

struct TrainResult {
  int64_t steps = 0;
  int64_t epochs = 0;
  int64_t samples = 0;  ///< real (weight 1) samples trained on, all ranks
  double samples_per_s = 0;
  double train_loss = 0;
  double eval_loss = 0;
  double eval_accuracy = 0;
  double wall_s = 0;
  bool completed = true;     ///< false if a stop request ended the run early
  std::vector<EpochStats> history;
};

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
  int64_t samples = 0;
};

class Trainer {
 public:
  /// Builds the model (seeded, identical on every rank; rank 0's state is
  /// broadcast anyway) and the optimizer. Collective: every rank constructs it.
  Trainer(const Config& cfg, collective::Communicator& comm, const DataSplit& data,
          at::Device device, const Plan& plan);

  const Plan& plan() const { return plan_; }
  /// Replaces the plan (the batch search measures several per-GPU batches).
  void setPlan(const Plan& plan) { plan_ = plan; }
  torch::nn::Sequential& model() { return model_; }
  at::Device device() const { return device_; }

  /// One optimizer step: the micro-batches of step `step` of the current epoch of
  /// `sharder`, then the gradient sum over ranks and the update at `lr`. Returns
  /// this rank's sum of per-sample losses (weight-0 samples excluded). `stop`, if
  /// given, is this rank's stop request in and "any rank asked" out (agreed in the
  /// gradient allreduce, so all ranks stop after the same step).
  double trainStep(const Sharder& sharder, int64_t step, double lr, bool* stop = nullptr);

  // trainStep() in its three parts. Only syncGradients() communicates, so a rank
  // whose computeGradients() failed (out of memory) can still take part in it and
  // no rank waits forever (Note [search agreement] in worker/search.h).

  /// Forward and backward over this rank's micro-batches; returns the local loss sum.
  double computeGradients(const Sharder& sharder, int64_t step);
  /// Drops all gradients and autograd state (after a failed computeGradients()).
  void clearGradients();
  /// Sums gradients over the ranks (zeros where this rank has none); see trainStep for `stop`.
  void syncGradients(bool* stop = nullptr);
  /// Optimizer update at `lr`.
  void applyUpdate(double lr);

  /// Averages BatchNorm buffers by taking rank 0's (as DDP's broadcast_buffers),
  /// then evaluates on this rank's shard of the validation set; every validation
  /// sample counts exactly once over all ranks.
  EvalResult evaluate();

  /// Throws TrainingError if a parameter or buffer is not finite on any rank, or
  /// the parameters differ between ranks.
  void checkHealth(int64_t epoch);

  /// Full run over plan().epochs (or train.max_steps). `stop_requested` is polled
  /// every step (e.g. a SIGTERM flag); when it is true on any rank, every rank
  /// finishes the same step and the run ends with `completed = false`.
  TrainResult train(Console& console, const std::function<bool()>& stop_requested = {});

 private:
  const Config& cfg_;
  collective::Communicator& comm_;
  const DataSplit& data_;
  at::Device device_;
  Plan plan_;
  torch::nn::Sequential model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<collective::GradientSynchronizer> sync_;
  torch::Tensor train_x_, train_y_;
};

/// Fixed-point text with `digits` decimals.
std::string formatFixed(double v, int digits);

/// "1:02:03" / "2:03".
std::string formatDuration(double seconds);

}  // namespace batchdist::worker
