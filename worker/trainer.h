#pragma once
// The training loop: plan -> micro-batches -> forward/backward -> gradient sum ->
// optimizer, with distributed evaluation, per-epoch health checks and a
// breakdown of where the time goes.

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "collective/grad_sync.h"
#include "worker/config.h"
#include "worker/data.h"
#include "worker/loader.h"
#include "worker/model.h"
#include "worker/plan.h"
#include "worker/precision.h"

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

/// Where a step's time goes (seconds, this rank).
struct TimeBreakdown {
  double data_wait = 0;  ///< blocked waiting for the loader
  double compute = 0;    ///< forward, backward, optimizer
  double comm = 0;       ///< exposed gradient communication
  double total() const { return data_wait + compute + comm; }
  void add(const TimeBreakdown& o) {
    data_wait += o.data_wait;
    compute += o.compute;
    comm += o.comm;
  }
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
  TimeBreakdown time;        ///< summed over the run, this rank (rank 0 reports)
  double peak_memory_mb = 0; ///< CUDA allocator peak (0 on CPU)
  double memory_total_mb = 0;
  double gpu_utilization = -1;  ///< mean NVML utilization in %, -1 if unknown
  int64_t skipped_steps = 0; ///< fp16: steps skipped for inf/NaN gradients
  double loss_scale = 0;     ///< fp16: final loss scale
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
  /// broadcast anyway), the optimizer and the loader. Collective.
  Trainer(const Config& cfg, collective::Communicator& comm, const DataSplit& data,
          at::Device device, const Plan& plan, const std::string& base_dir = "");
  ~Trainer();

  const Plan& plan() const { return plan_; }
  /// Replaces the plan (the batch search measures several per-GPU batches).
  void setPlan(const Plan& plan) { plan_ = plan; }
  Model& model() { return *model_; }
  Loader& loader() { return *loader_; }
  at::Device device() const { return device_; }

  /// This rank's micro-batches for steps [first, first + count) of the sharder's
  /// current epoch, in the order the step functions consume them.
  std::vector<MicroBatch> jobs(const Sharder& sharder, int64_t first, int64_t count) const;

  /// One optimizer step over the next plan().accum batches of loader(); `real`
  /// is the step's number of real samples over all ranks (Sharder::realSamples).
  /// Returns this rank's loss sum. `stop`, if given, is this rank's stop request
  /// in and "any rank asked" out (agreed in the gradient allreduce).
  double trainStep(int64_t real, double lr, bool* stop = nullptr);

  // trainStep() in its three parts. Only syncGradients() communicates, so a rank
  // whose computeGradients() failed (out of memory) can still take part in it and
  // no rank waits forever (Note [search agreement] in worker/search.h).

  /// Forward and backward over the next plan().accum batches; returns the loss sum.
  double computeGradients(int64_t real);
  /// Drops all gradients (after a failed computeGradients()).
  void clearGradients();
  /// Sums gradients over the ranks (zeros where this rank has none).
  void syncGradients(bool* stop = nullptr);
  /// Optimizer update at `lr` (fp16: unscales, or skips a step with inf/NaN gradients).
  void applyUpdate(double lr);

  /// Takes rank 0's BatchNorm buffers (as DDP's broadcast_buffers), then
  /// evaluates this rank's shard of the validation set; every validation sample
  /// counts exactly once over all ranks.
  EvalResult evaluate();

  /// Throws TrainingError if a parameter or buffer is not finite on any rank, or
  /// the parameters differ between ranks.
  void checkHealth(int64_t epoch);

  /// Full run over plan().epochs (or train.max_steps). `stop_requested` is polled
  /// every step (e.g. a SIGTERM flag); when it is true on any rank, every rank
  /// finishes the same step and the run ends with `completed = false`.
  TrainResult train(Console& console, const std::function<bool()>& stop_requested = {});

  /// Time spent since the last call (this rank).
  TimeBreakdown takeTime();

 private:
  void synchronize() const;

  const Config& cfg_;
  collective::Communicator& comm_;
  const DataSplit& data_;
  at::Device device_;
  Plan plan_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<collective::GradientSynchronizer> sync_;
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<LossScaler> scaler_;  // fp16 only
  Transform eval_transform_;
  TimeBreakdown time_;
};

/// Fixed-point text with `digits` decimals.
std::string formatFixed(double v, int digits);

/// "1:02:03" / "2:03".
std::string formatDuration(double seconds);

/// The end-of-run diagnosis (rank 0): one line per finding, each quoting the
/// numbers it rests on. Empty when nothing stands out.
std::vector<std::string> diagnose(const Config& cfg, const TrainResult& r, at::Device device,
                                  const std::string& device_name);

}  // namespace batchdist::worker
