#pragma once
// Mixed precision: autocast scopes and the fp16 dynamic loss scaler.

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "worker/config/config.h"
#include <string>
#include <vector>

namespace batchdist::worker {

/// Autocast for the forward pass: bf16 (CPU or CUDA) or fp16 (CUDA); fp32 is a no-op.
class AutocastScope {
 public:
  AutocastScope(const at::Device& device, Precision precision);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  at::DeviceType type_ = at::kCPU;
};

/// Throws ConfigError (naming `source`, the config file) for a precision the
/// device cannot run (fp16 on CPU).
void checkPrecision(Precision precision, const at::Device& device, const std::string& source);

/// fp16 dynamic loss scaling (Micikevicius et al. 2018): the loss is multiplied by
/// scale() before backward; a step whose summed gradients hold inf/NaN is skipped
/// and the scale backs off; after `growth_interval` finite steps it grows.
/// Gradients are summed over ranks before the check, so every rank sees the same
/// verdict and skips the same steps.
class LossScaler {
 public:
  LossScaler(double initial_scale, int64_t growth_interval, double backoff = 0.5,
             double growth = 2.0);
  double scale() const { return scale_; }
  /// Records the outcome of a step; returns true if the optimizer should step.
  bool update(bool found_inf);
  int64_t skippedSteps() const { return skipped_; }
  int64_t growthTracker() const { return tracker_; }
  /// Restores a checkpoint's state (scale, growth tracker, skipped steps).
  void restore(double scale, int64_t tracker, int64_t skipped) {
    scale_ = scale;
    tracker_ = tracker;
    skipped_ = skipped;
  }

 private:
  double scale_;
  int64_t growth_interval_;
  double backoff_;
  double growth_;
  int64_t tracker_ = 0;
  int64_t skipped_ = 0;
};

/// The fp16 step decision, after the gradients were summed over the ranks: if any
/// gradient holds inf/NaN the step is skipped (returns false) and the scale backs
/// off; otherwise the gradients are divided by the scale they were computed
/// with and the optimizer may step (returns true).
bool unscaleOrSkip(LossScaler& scaler, const std::vector<at::Tensor>& params);

}  // namespace batchdist::worker
