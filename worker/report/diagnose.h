#pragma once
// The end-of-run diagnosis rank 0 prints.

#include <string>
#include <vector>

#include "worker/config/config.h"
#include "worker/model/flops.h"
#include "worker/train/result.h"

namespace batchdist::worker {

/// One line per finding, each quoting the numbers it rests on; empty when
/// nothing stands out. `cuda`: the run was on a GPU named `device_name`.
/// `train_samples` (N, 0: unknown) caps the global batch the noise-scale finding
/// advises at N / batch.adapt_min_steps (dataCeiling in worker/plan/adapt.h).
/// `tokens_per_sample` (the plan's, Note [tokens per sample] in worker/plan/plan.h;
/// 0: not tokens) adds the tokens of B_simple and of the batches it names.
/// `yardstick` (Note [mfu]; null: none) adds a finding when a GPU's MFU is low.
std::vector<std::string> diagnose(const Config& cfg, const TrainResult& r, bool cuda,
                                  const std::string& device_name, int64_t train_samples = 0,
                                  int64_t tokens_per_sample = 0,
                                  const Yardstick* yardstick = nullptr);

/// A noise scale B_simple as the console and the diagnosis quote it: whole
/// samples from 10 up, two significant digits below (a B of 0.4 is not "0",
/// which a ratio like G / B would then divide by).
std::string noiseScaleText(double b);

}  // namespace batchdist::worker
