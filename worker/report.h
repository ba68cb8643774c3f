#pragma once
// The JSON run report (--report PATH, and <output>/report.json).

#include <string>

#include "worker/config.h"
#include "worker/plan.h"
#include "worker/trainer.h"

namespace batchdist::worker {

struct RunInfo {
  int64_t world_size = 1;
  std::string backend;
  std::string device;
  std::string torch_version;
  std::string data_origin;
  std::string extra_json;  ///< further members (raw JSON "key": value, ...) or empty
};

std::string runReport(const Config& cfg, const Plan& plan, const TrainResult& result,
                      const RunInfo& info);

/// Writes `text` to `path` atomically (temp file + rename); creates parent dirs.
/// Throws Error naming the path.
void writeFileAtomic(const std::string& path, const std::string& text);

}  // namespace batchdist::worker
