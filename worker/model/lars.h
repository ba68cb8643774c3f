#pragma once
// LARS (You et al. 2017): SGD with momentum and a layer-wise trust ratio, stepped
// tensor by tensor or by ATen's multi-tensor ops (Note [multi-tensor step]).

#include <memory>
#include <vector>

#include "worker/config/config.h"
#include "worker/model/optimizer.h"

namespace batchdist::worker {

/// LARS over `params` (optim.momentum, weight_decay, trust_coefficient, kernels:
/// kFused has no kernel of its own, it steps as kMultiTensor).
std::unique_ptr<Optimizer> makeLars(std::vector<OptimizerParam> params, const OptimConfig& cfg);

}  // namespace batchdist::worker
