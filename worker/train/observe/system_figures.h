#pragma once
// Note [system metrics] over a run: the sampler a rank starts, and every rank's
// series gathered for rank 0's report.

#include <c10/core/Device.h>

#include <memory>
#include <vector>

#include "collective/communicator.h"
#include "worker/config/config.h"
#include "worker/data/loader.h"
#include "worker/train/observe/system_sampler.h"

namespace batchdist::worker {

/// The sampler for a run on `device` (none when report.sample_s is 0). NVML
/// (Note [nvml metrics]) on a GPU, or wherever BATCHDIST_NVML_LIBRARY names a
/// library (a CPU run then reads device 0: the tests' stub); loader_busy from
/// `train`'s threads.
std::unique_ptr<SystemSampler> makeSystemSampler(const ReportConfig& cfg, at::Device device,
                                                 int rank, const Loader& train);

/// Stops `sampler`; rank 0 gets every rank's figures, by rank (the others: none).
/// Collective: every rank calls it after the same last step.
std::vector<RankSystem> gatherSystemFigures(collective::Communicator& comm,
                                            std::unique_ptr<SystemSampler> sampler,
                                            std::vector<SystemPoint> series);

}  // namespace batchdist::worker
