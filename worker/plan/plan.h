#pragma once
// The batch plan: a pure function of (config, world size, dataset size).
//
// Note [equal shards]: every epoch is one seeded permutation of the training set,
// identical on every rank without communication (seed, epoch). It is cut into
// global batches of G = m x a x W samples; global batch s is cut into W x a
// micro-batches of exactly m samples, and rank r takes micro-batches r*a .. r*a+a-1.
// The short tail of the epoch is dropped (`drop`) or the last global batch is
// filled to G with samples from the start of the permutation carrying weight 0
// (`pad`), so every rank runs the same number of steps and every micro-batch has
// exactly m >= min_per_gpu samples: BatchNorm never sees an empty or size-1 batch.
// `keep` (the naive behaviour: a short last batch split as evenly as possible) is
// refused for models with BatchNorm.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "worker/config/config.h"

namespace batchdist::worker {

// Note [tokens per sample]: when a sample is a window of token data (Note
// [tokens]), a rate or a batch is also shown in tokens: tokens/s beside samples/s,
// tokens per step beside the global batch (the console's plan, progress, epoch and
// closing lines, report.json and report.html (its charts' rate axes in tokens/s),
// metrics.jsonl, TensorBoard, the search's lines, table, why (a cached one's too)
// and search.json, the gradient noise scale and the diagnosis's advice, `plan
// --json` with per_gpu auto too, the `data` verb, the adaptive batch's decision
// lines: splitText() in worker/plan/adapt.h). tokensPerSample() is
// the one place that knows how many tokens a sample trains on; the plan carries it
// (Plan::tokens_per_sample) and everything after the plan reads it from there
// (the search, which runs before the plan, from the same function). 0 means the
// samples are not token windows: every output is then exactly as without tokens.

struct Plan {
  int64_t world_size = 1;
  int64_t per_gpu = 1;       ///< m
  int64_t accum = 1;         ///< a
  int64_t global = 1;        ///< G = m * a * W
  int64_t tokens_per_sample = 0;  ///< Note [tokens per sample] (0: samples are not tokens)
  int64_t global_tokens = 0;      ///< batch.global_tokens asked (Note [global tokens]; 0: none)
  LastBatch last_batch = LastBatch::kDrop;
  int64_t dataset_size = 0;  ///< training samples N
  int64_t steps_per_epoch = 0;
  int64_t samples_dropped = 0;  ///< per epoch
  int64_t samples_padded = 0;   ///< per epoch (weight 0)
  int64_t epochs = 1;
  int64_t total_steps = 0;      ///< optimizer steps of the run (max_steps applied)

  // Learning rate (Note [lr follows the batch]).
  std::string optimizer;
  double base_lr = 0;        ///< optim.lr, the rate at base_batch
  int64_t base_batch = 0;
  LrScaling lr_scaling = LrScaling::kLinear;
  double lr = 0;             ///< scaled peak rate
  int64_t warmup_steps = 0;
  Schedule schedule = Schedule::kConstant;
  double min_lr = 0;
  double step_gamma = 0.1;
  std::vector<int64_t> milestones;

  std::vector<std::string> warnings;

  /// Learning rate of optimizer step `step` (0-based, counted over the whole run).
  double lrAt(int64_t step) const;
  /// The same schedule at a fractional step (Note [goodput] in worker/plan/adapt.h:
  /// the adaptive batch counts progress in steps at G0): equal to lrAt(s) at every
  /// whole step s; warmup capped at `lr`; cosine reaches min_lr at total_steps.
  double lrAtProgress(double progress) const;
  /// Slots (samples incl. padding) each rank processes per epoch; equal on all
  /// ranks except under `keep`.
  int64_t rankSamplesPerEpoch(int64_t rank) const;
  /// Tokens of a global batch (0 when samples are not tokens).
  int64_t tokensPerStep() const { return global * tokens_per_sample; }
};

/// Note [tokens per sample]: model.seq_len when the samples are windows of token
/// data (data.name: tokens), else 0.
int64_t tokensPerSample(const Config& cfg);

/// Resolves the batch triple and the learning rate. `per_gpu_override` > 0
/// replaces batch.per_gpu (the batch search passes its choice here). Throws
/// ConfigError with the arithmetic and the nearest valid values.
Plan makePlan(const Config& cfg, int64_t world_size, int64_t dataset_size, bool has_batchnorm,
              int64_t per_gpu_override = 0);

/// The smallest per-GPU micro-batch allowed (Note [equal shards]): with BatchNorm,
/// batch.min_per_gpu and never below 2; 1 without.
int64_t minPerGpu(const Config& cfg, bool has_batchnorm);

/// Note [oom back-off] (worker/train/oom_guard.h): the per-GPU batch a step is
/// redone with after an out-of-memory: the largest proper divisor of m (m / 2
/// when m is even); 0 when that is below `min_per_gpu` (the BatchNorm minimum,
/// 1 without BatchNorm) or m is 1.
int64_t backedOffPerGpu(int64_t per_gpu, int64_t min_per_gpu);

/// `plan` split as per-GPU batch `per_gpu` (which must divide G / W): the
/// accumulation follows; G, the shards of every step (Note [equal shards]), the
/// steps and the learning rate stay.
Plan withPerGpu(const Plan& plan, int64_t per_gpu);

/// `plan` at another global batch (Note [goodput] in worker/plan/adapt.h): G =
/// per_gpu x accum x W, with the steps per epoch and the dropped or padded samples
/// of that G; the learning-rate fields and the run's length stay (an adaptive run
/// takes its lr and its end from the plan at G0). Error when the split is not one.
Plan withGlobal(const Plan& plan, int64_t global, int64_t per_gpu, int64_t accum);

/// The scaled peak learning rate for global batch G.
double scaledLr(double base_lr, int64_t base_batch, int64_t global, LrScaling rule);

/// Human-readable plan (the `batchdist plan` output).
std::string planText(const Plan& p);
/// Its tokens lines (Note [tokens per sample]): the tokens of a step, and how
/// batch.global_tokens rounded to whole windows (Note [global tokens] in
/// worker/config/config.cc); "" when the samples are not tokens.
std::string planTokensText(const Plan& p);
/// The plan as JSON (`batchdist plan --json`, the run report).
nlohmann::ordered_json planJson(const Plan& p);
/// Its tokens keys (Note [tokens per sample]): tokens_per_sample, tokens_per_step
/// (when the global batch is known: p.global > 0) and global_tokens_asked (when
/// batch.global_tokens gave it); an empty object when the samples are not tokens.
nlohmann::ordered_json planTokensJson(const Plan& p);

/// One rank's micro-batch: dataset indices and per-sample loss weights (1, or 0 for padding).
struct MicroBatch {
  std::vector<int64_t> indices;
  std::vector<float> weights;
};

/// Cuts epochs into micro-batches according to Note [equal shards].
class Sharder {
 public:
  Sharder(const Plan& plan, uint64_t seed);

  /// Builds the permutation of `epoch` (same on every rank); the cut starts again at step 0.
  void setEpoch(int64_t epoch);
  /// Note [adaptive cut]: steps from `first_step` of the epoch on begin at sample
  /// position `begin` of its permutation and follow each other G apart. The
  /// default cut (0, 0) is Note [equal shards]'s: step s begins at s x G.
  void setCut(int64_t first_step, int64_t begin);
  /// The same permutation and cut with another split of the same G, or (at the
  /// cut's first step) another G.
  Sharder withPlan(const Plan& plan) const;
  int64_t cutFirstStep() const { return cut_step_; }
  int64_t cutBegin() const { return cut_begin_; }
  /// Sample position of step `step` (>= the cut's first step) in the permutation.
  int64_t position(int64_t step) const { return cut_begin_ + (step - cut_step_) * plan_.global; }
  /// Steps of the epoch under the current cut: drop leaves out a tail shorter
  /// than G, pad fills the last step. plan.steps_per_epoch for the default cut.
  int64_t stepsInEpoch() const;
  /// The loader's index of step `step`'s first micro-batch (the transform seeds
  /// follow it): step x accum under the default cut; a later cut counts on from
  /// its begin position, past every index the epoch used before it.
  int64_t jobIndex(int64_t step) const { return cut_begin_ + (step - cut_step_) * plan_.accum; }
  const std::vector<int64_t>& permutation() const { return perm_; }

  /// Micro-batch `k` (0 <= k < accum) of rank `rank` in step `step` of the current epoch.
  MicroBatch micro(int64_t step, int64_t k, int64_t rank) const;

  /// Samples of weight 1 in global step `step`: the loss denominator, known to
  /// every rank without communication (Note [loss normalisation]).
  int64_t realSamples(int64_t step) const;

 private:
  Plan plan_;
  uint64_t seed_;
  std::vector<int64_t> perm_;
  int64_t cut_step_ = 0;   ///< Note [adaptive cut]
  int64_t cut_begin_ = 0;
};

/// The seeded permutation of 0..n-1 for (seed, epoch), identical everywhere.
std::vector<int64_t> seededPermutation(int64_t n, uint64_t seed, int64_t epoch);

/// Contiguous evaluation shard [begin, end) of `n` samples for `rank` of `world`:
/// sizes differ by at most one and every sample belongs to exactly one rank.
std::pair<int64_t, int64_t> evalShard(int64_t n, int64_t world, int64_t rank);

}  // namespace batchdist::worker
