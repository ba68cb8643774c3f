#pragma once
// The training loop: plan -> micro-batches -> forward/backward -> gradient sum ->
// optimizer, with distributed evaluation, per-epoch health checks and a
// breakdown of where the time goes.

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "collective/grad_sync.h"
#include "collective/reducer.h"
#include "worker/config/config.h"
#include "worker/data/data.h"
#include "worker/data/loader.h"
#include "worker/model/model.h"
#include "worker/plan/plan.h"
#include "worker/model/optimizer.h"
#include "worker/model/precision.h"
#include "worker/train/gpu_monitor.h"
#include "worker/train/noise_scale.h"
#include "worker/train/result.h"

namespace batchdist::worker {

class Console;
class Checkpointer;
struct TrainState;

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
          at::Device device, const Plan& plan);
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
  double trainStep(int64_t real, double lr, bool* stop = nullptr, bool* checkpoint = nullptr);

  // trainStep() in its three parts. A rank whose computeGradients() failed (out
  // of memory) still calls syncGradients(), which sends what it has (zeros), so
  // no rank waits forever (Note [search agreement] in worker/search/search.h):
  // with the overlapped reducer the other ranks' buckets start during their
  // backward and this rank's in syncGradients(), in the same order.

  /// Forward and backward over the next plan().accum batches; returns the loss sum.
  /// `side`: this rank's value for the gradient allreduce's side channel (the
  /// stop flag), summed over the ranks by syncGradients().
  double computeGradients(int64_t real, double side = 0.0);
  /// Drops all gradients (after a failed computeGradients()).
  void clearGradients();
  /// Sums gradients over the ranks (zeros where this rank has none). `stop` and
  /// `checkpoint`, if given, are this rank's wishes in and "any rank wished" out,
  /// agreed in the same allreduce.
  void syncGradients(bool* stop = nullptr, bool* checkpoint = nullptr);
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

  /// Checkpoints during train() (Note [checkpoint]); null: none. Not owned.
  void setCheckpointer(Checkpointer* checkpointer) { checkpointer_ = checkpointer; }
  /// Makes train() continue from `pos` (state restored with restoreState first).
  void resumeAt(const TrainPosition& pos) { resume_ = pos; }
  /// The model, optimizer and loss scaler, for checkpoints.
  TrainState state();

  /// Time spent since the last call (this rank).
  TimeBreakdown takeTime();

  /// The gradient noise scale measured so far (train.noise_scale; Note [gradient
  /// noise scale] in noise_scale.h): fed by every syncGradients() of a step whose
  /// samples are all real, with more than one rank.
  const NoiseScaleEstimator& noiseScale() const { return noise_; }

 private:
  struct EpochRun;
  /// NVML utilization, sampled every 10 steps on CUDA.
  struct UtilizationSampler {
    std::unique_ptr<GpuMonitor> monitor;
    double sum = 0;
    int64_t count = 0;
    void sample(int64_t global_step);
  };
  void runSteps(EpochRun& e, const Sharder& sharder, int64_t* global_step,
                const std::function<bool()>& stop_requested, Console& console, double run_started,
                UtilizationSampler& gpu, TrainResult& result);
  void checkpoint(const EpochRun& e, int64_t global_step, bool mid_epoch, Console& console,
                  TrainResult& result);
  void progress(Console& console, const EpochRun& e, int64_t step, int64_t global_step,
                double run_started);
  void logMetrics(EpochRun& e, int64_t step, int64_t global_step, double run_started,
                  TrainResult& result);
  void logEpochMetrics(const EpochRun& e, const EpochStats& h, int64_t global_step,
                       double run_started, TrainResult& result);
  void recordNoise();
  void trackMicroBatch(int64_t k);
  NoiseScaleResult noiseResult() const;
  EpochStats finishEpoch(const EpochRun& e, Console& console);
  double encodeWishes(const bool* stop, const bool* checkpoint) const;
  void decodeWishes(double sum, bool* stop, bool* checkpoint) const;
  void synchronize() const;

  const Config& cfg_;
  collective::Communicator& comm_;
  const DataSplit& data_;
  at::Device device_;
  Plan plan_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<collective::Reducer> reducer_;              // dist.overlap: true
  std::unique_ptr<collective::GradientSynchronizer> sync_;   // dist.overlap: false
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<LossScaler> scaler_;  // fp16 only
  Transform eval_transform_;
  TimeBreakdown time_;
  Checkpointer* checkpointer_ = nullptr;
  TrainPosition resume_;
  NoiseScaleEstimator noise_;
  double grad_scale_ = 1;  // fp16 loss scale the current gradients carry
  int64_t step_real_ = 0;  // real samples of the current step, all ranks
  // One rank with accumulation: the micro-batches give B_small (Note [gradient
  // noise scale]); the previous micro-batch's running gradient, sum of |d_k|^2.
  bool microNoise() const {
    return cfg_.train.noise_scale && comm_.size() == 1 && plan_.accum > 1;
  }
  std::vector<at::Tensor> micro_prev_;
  at::Tensor micro_sq_, micro_total_sq_;
};

}  // namespace batchdist::worker
