#pragma once
// The gradient noise scale: the global batch beyond which more samples per step
// buy little (McCandlish et al. 2018, "An Empirical Model of Large-Batch
// Training", App. A). Pure arithmetic, no torch: the trainer feeds it two
// squared norms per step (Note [gradient norms] in collective/grad_sync.h).
//
// Note [gradient noise scale]: with per-rank batch b and W ranks, |G_small|^2 is
// the squared norm of a gradient averaged over B_small = b samples, |G_big|^2 that
// of the gradient averaged over B_big = W b. Both are unbiased up to the noise:
//   E|G_B|^2 = |G|^2 + tr(S) / B,
// so two batch sizes give
//   |G|^2 ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small),
//   tr(S) ~ (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big),
// and B_simple = tr(S) / |G|^2, with numerator and denominator smoothed apart
// (each estimate is noisy and |G|^2 may come out negative at one step) before
// dividing. Training at a global batch B needs about (1 + B_noise / B) times the
// minimal number of steps and (1 + B / B_noise) times the minimal number of
// samples: far above B_simple, samples are wasted.
//
// Scaling (Note [loss normalisation] in trainer.cc): rank r's gradient before the
// sum is g_r = (1/R) sum_{i on r} grad l_i with R = W b real samples, i.e. 1/W of
// its own mean gradient. So |G_small|^2 = mean_r |W g_r|^2 = W sum_r |g_r|^2 (the
// mean over the W ranks: W small-batch samples per step), |G_big|^2 = |sum_r g_r|^2;
// fp16 gradients are divided by the loss scale (squared) first.
//
// Note [noise cadence]: the two norms cost two passes over the gradients, one
// before the allreduce and one after, on the critical path of the step. On the
// quickstart (17 k parameters, ~0.4 ms steps with OpenBLAS) they took ~12-20 us,
// 3-5 % of the step. Consecutive steps' estimates are nearly independent samples of
// the same quantity, so the trainer measures one step in
// `train.noise_scale_every` (4 by default; 1: every step): the cost falls to
// about 1 %, the smoothed figure (decay 0.95 per measured step) spans ~80 steps,
// and an epoch's figure has a quarter of the samples. Every rank counts the steps
// it starts (retries after an out-of-memory included), so all agree which steps
// carry their norm in the allreduce.

#include <cstdint>

namespace batchdist::worker {

class NoiseScaleEstimator {
 public:
  /// `decay`: weight of the past in the exponential moving averages (per step).
  explicit NoiseScaleEstimator(double decay = 0.95) : decay_(decay) {}

  /// Adds one step's measurement: `small_sq` = |G_small|^2 over batches of
  /// `b_small` samples, `big_sq` = |G_big|^2 over `b_big`. Ignored (returns false)
  /// when b_big <= b_small or a value is not finite (e.g. an fp16 overflow).
  bool add(double small_sq, double b_small, double big_sq, double b_big);

  /// Steps added since construction.
  int64_t steps() const { return steps_; }
  /// Smoothed |G|^2 and tr(S) (bias-corrected EMAs); 0 before the first step.
  double gradSq() const;
  double trace() const;
  /// Smoothed tr(S) / |G|^2, in samples; < 0 when unknown (no step yet, or the
  /// smoothed |G|^2 is not positive: the signal is lost in the noise).
  double bSimple() const;

  /// B_simple from all steps since the last resetWindow() (plain means, not EMAs):
  /// the per-epoch figure. < 0 when unknown.
  double windowBSimple() const;
  int64_t windowSteps() const { return window_steps_; }
  void resetWindow();

  /// Everything the estimator holds, for checkpoints: a resumed run continues
  /// the same averages (the adaptive batch decides from them).
  struct State {
    int64_t steps = 0;
    double ema_g2 = 0, ema_tr = 0, weight = 0;
    int64_t window_steps = 0;
    double window_g2 = 0, window_tr = 0;
  };
  State state() const {
    return {steps_, ema_g2_, ema_tr_, weight_, window_steps_, window_g2_, window_tr_};
  }
  void restore(const State& s) {
    steps_ = s.steps;
    ema_g2_ = s.ema_g2;
    ema_tr_ = s.ema_tr;
    weight_ = s.weight;
    window_steps_ = s.window_steps;
    window_g2_ = s.window_g2;
    window_tr_ = s.window_tr;
  }

 private:
  double decay_;
  int64_t steps_ = 0;
  double ema_g2_ = 0, ema_tr_ = 0, weight_ = 0;  // weight_: bias correction
  int64_t window_steps_ = 0;
  double window_g2_ = 0, window_tr_ = 0;
};

/// |G_small|^2, |G_big|^2 and the batch sizes of one step, from the norms the
/// gradient sum measured (Note [gradient noise scale]): `local_sum` = sum over
/// ranks of |g_r|^2, `summed` = |sum_r g_r|^2, `scale` the fp16 loss scale (1
/// otherwise), `world` ranks of `per_rank` samples each.
struct NoiseSample {
  double small_sq = 0, b_small = 0, big_sq = 0, b_big = 0;
};
NoiseSample noiseSample(double local_sum, double summed, double scale, int64_t world,
                        int64_t per_rank);

}  // namespace batchdist::worker
