#pragma once
// One training step: the model, its task, the update strategy and the loader;
// forward and backward over the micro-batches, the gradient sum, the optimizer
// update. The batch search times it (StepMeasurer) and the run's loop (Trainer)
// drives it (Note [step engine]).

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <vector>

#include "collective/communicator.h"
#include "worker/common/faults.h"
#include "worker/config/config.h"
#include "worker/data/data.h"
#include "worker/data/loader.h"
#include "worker/model/model.h"
#include "worker/plan/plan.h"
#include "worker/task/task.h"
#include "worker/train/step/evaluator.h"
#include "worker/train/step/noise_probe.h"
#include "worker/train/result.h"
#include "worker/train/step/update_strategy.h"

namespace batchdist::worker {

struct TrainState;

// Note [step engine]
// ~~~~~~~~~~~~~~~~~~
// A step is three parts, always in this order on every rank:
//   computeGradients()  forward and backward over plan().accum micro-batches of
//                       the loader (Note [loss normalisation]);
//   syncGradients()     the update strategy's gradient sum, which also carries
//                       the ranks' wishes (Note [step wishes]) and feeds the
//                       noise probe (Note [gradient noise scale]);
//   applyUpdate(lr)     the optimizer.
// A rank whose computeGradients() failed (out of memory) still calls
// syncGradients(), which sends what it has (zeros), so no rank waits forever
// (Note [search agreement] in worker/search/search.h): with the overlapped
// reducer the other ranks' buckets start during their backward and this rank's
// in syncGradients(), in the same order. The engine knows nothing of epochs,
// checkpoints or back-offs: the batch search (StepMeasurer) times it as it is,
// and the run's loop (Trainer) drives it step after step. What it is built from
// is a value: the validated config, the levers in force (Note [lever search])
// and the plan; setLevers() and setPlan() replace them, nothing edits the config.

/// Note [step wishes]: what one rank asks of a step, carried in the gradient
/// allreduce's side channel at no extra collective. Each wish has a slot of its
/// own that counts the ranks asking (0..W), so the summed channel is exact in the
/// fp32 bucket for any W below 2^24: no packing of several counts into one number
/// (exact only while W (W + 2) < 2^24, about 4 000 ranks).
struct StepWishes {
  bool stop = false;        ///< a stop signal arrived: every rank stops after this step
  bool checkpoint = false;  ///< a checkpoint is due (e.g. SIGUSR1): every rank writes it
  bool oom = false;         ///< this step ran out of memory (Note [oom back-off])
};

/// This rank's wishes as its share of the side channel.
collective::SideChannel packWishes(const StepWishes& mine);
/// The job's wishes from the side channel summed over the ranks: any rank's wish counts.
StepWishes unpackWishes(const collective::SideChannel& summed);

/// Note [sync batchnorm failure]: this rank's forward finished, but another
/// rank's ran out of memory; the step is abandoned on every rank.
struct PeerOutOfMemory : std::exception {
  const char* what() const noexcept override { return "another rank ran out of memory in forward"; }
};

/// Note [fault plan]'s out-of-memory for one step: thrown halfway through the
/// last micro-batch's forward or backward.
struct InjectOom {
  bool forward = false;
  bool backward = false;
};

/// How computeOrCatch() ended.
enum class ComputeOutcome {
  kOk,
  kOutOfMemory,      ///< this rank ran out: its gradients dropped, the CUDA cache emptied
  kPeerOutOfMemory,  ///< another rank ran out in a synchronised BatchNorm's forward
};

class StepEngine {
 public:
  /// Builds the model (seeded, identical on every rank; rank 0's state is
  /// broadcast anyway), the update strategy for `levers` (Note [update
  /// strategy]: gradient sync and optimizer) and the loaders. Collective.
  /// `levers`: concrete (no auto); none: the config's own. `faults`: the faults
  /// the tests inject (Note [fault plan]), read here and not kept; null: none.
  StepEngine(const Config& cfg, collective::Communicator& comm, const DataSplit& data,
             at::Device device, const Plan& plan, const FaultPlan* faults = nullptr,
             std::optional<Levers> levers = std::nullopt);
  ~StepEngine();
  StepEngine(const StepEngine&) = delete;
  StepEngine& operator=(const StepEngine&) = delete;

  /// The levers in force (concrete).
  Levers levers() const { return configLevers(cfg_); }
  const Plan& plan() const { return plan_; }
  /// Replaces the plan (the search's candidates; a back-off's or an adaptive split).
  void setPlan(const Plan& plan) { plan_ = plan; }
  /// Note [lever switch]: another recompute is a flag of the model's forward;
  /// another sharding a new update strategy built for `to` (the old one gone
  /// first: its memory, its hooks; the model's parameters stay, the gradients
  /// and optimizer state start anew). False, and nothing changed, when the model
  /// cannot switch recompute (the caller builds a new engine). Collective.
  bool setLevers(const Levers& to);

  Model& model() { return *model_; }
  const Task& task() const { return *task_; }
  /// How gradients become a step (Note [update strategy]).
  UpdateStrategy& update() { return *update_; }
  Loader& loader() { return *loader_; }
  Evaluator& evaluator() { return *evaluator_; }
  at::Device device() const { return device_; }
  NoiseProbe& noise() { return noise_; }
  const NoiseProbe& noise() const { return noise_; }

  /// This rank's micro-batches for steps [first, first + count) of the sharder's
  /// current epoch, in the order the step functions consume them.
  std::vector<MicroBatch> jobs(const Sharder& sharder, int64_t first, int64_t count) const;

  /// One step over the next plan().accum batches of loader(); `real` is the
  /// step's number of real samples over all ranks (Sharder::realSamples).
  /// Returns this rank's loss sum. `stop`, `checkpoint`: as syncGradients().
  double trainStep(int64_t real, double lr, bool* stop = nullptr, bool* checkpoint = nullptr);

  /// Forward and backward over the next plan().accum batches; returns the loss sum.
  double computeGradients(int64_t real, InjectOom inject = {});
  /// computeGradients() with an out-of-memory caught (anything else is thrown).
  ComputeOutcome computeOrCatch(int64_t real, InjectOom inject, double* loss);
  /// Drops all gradients (after a failed computeGradients()).
  void clearGradients();
  /// Sums gradients over the ranks (zeros where this rank has none). `stop`,
  /// `checkpoint` and `oom`, if given, are this rank's wishes (oom: its step
  /// failed) in and "any rank" out, agreed in the same allreduce. A step that
  /// stands (no oom) feeds the noise probe.
  void syncGradients(bool* stop = nullptr, bool* checkpoint = nullptr, bool* oom = nullptr);
  /// Optimizer update at `lr` (UpdateStrategy::step: fp16 unscales, or skips a
  /// step with inf/NaN gradients), timed.
  void applyUpdate(double lr);

  /// Takes rank 0's BatchNorm buffers (as DDP's broadcast_buffers), then
  /// evaluates this rank's shard of the validation set; every validation sample
  /// counts exactly once over all ranks (Evaluator). Collective.
  EvalResult evaluate() { return evaluator_->evaluate(plan_.per_gpu); }
  /// Throws TrainingError if a parameter or buffer is not finite on any rank, or
  /// the parameters differ between ranks. Collective.
  void checkHealth(int64_t epoch);

  /// The model, optimizer and loss scaler, for checkpoints.
  TrainState state();
  /// Time spent since the last call (this rank).
  TimeBreakdown takeTime();
  /// Optimizer update seconds since the last call (this rank): the adaptive
  /// batch's fixed cost of a step.
  double takeUpdateSeconds();
  /// The noise scale's figures for the report, at the current plan and levers.
  NoiseScaleResult noiseResult() const;

 private:
  void buildLoaders(const DataSplit& data, const FaultPlan& faults);
  /// One micro-batch's forward and weighted loss sum; with synchronised BatchNorm
  /// ends with the agreement of Note [sync batchnorm failure] (throws
  /// PeerOutOfMemory when another rank failed). `inject`: Note [fault plan]'s oom.
  at::Tensor forwardLoss(const Batch& batch, bool inject);
  /// Micro-batch `k`'s forward and backward; adds its weighted loss to `loss_sum`.
  void microStep(int64_t k, double scale, InjectOom inject, at::Tensor& loss_sum);
  void synchronize() const;

  Config cfg_;  ///< the run's, with the engine's levers in force
  collective::Communicator& comm_;
  at::Device device_;
  Plan plan_;
  std::unique_ptr<Task> task_;  ///< Note [task]
  std::unique_ptr<Model> model_;
  std::unique_ptr<UpdateStrategy> update_;  ///< Note [update strategy]
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<Evaluator> evaluator_;
  NoiseProbe noise_;
  TimeBreakdown time_;
  double update_s_ = 0;  ///< optimizer update seconds (this rank), for the fixed cost
  /// Note [fault plan]: BATCHDIST_FAULT_SLOW_UPDATE_US=N makes this rank's
  /// optimizer update N us slower (a rank with its own timings).
  int64_t slow_update_us_ = 0;
};

}  // namespace batchdist::worker
