#pragma once
// The batch search's measurer on the real training step: forward, backward,
// gradient averaging and optimizer on real batches of the configured data.

#include <ATen/core/Tensor.h>

#include <memory>

#include "collective/communicator.h"
#include "worker/common/faults.h"
#include "worker/config/config.h"
#include "worker/data/data.h"
#include "worker/search/search.h"

namespace batchdist::worker {

/// Builds a Trainer of its own (collective: every rank must call it), with the
/// faults the tests inject (Note [fault plan]; null: none).
std::unique_ptr<Measurer> makeTrainStepMeasurer(const Config& cfg, collective::Communicator& comm,
                                                const DataSplit& data, at::Device device,
                                                const FaultPlan* faults = nullptr);

}  // namespace batchdist::worker
