#pragma once
// The end-of-run diagnosis rank 0 prints.

#include <string>
#include <vector>

#include "worker/config/config.h"
#include "worker/train/result.h"

namespace batchdist::worker {

/// One line per finding, each quoting the numbers it rests on; empty when
/// nothing stands out. `cuda`: the run was on a GPU named `device_name`.
std::vector<std::string> diagnose(const Config& cfg, const TrainResult& r, bool cuda,
                                  const std::string& device_name);

}  // namespace batchdist::worker
