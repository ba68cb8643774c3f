#pragma once
// The JSON run report (--report PATH, and <output>/report.json): typed inputs,
// one nlohmann document out.

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "worker/config/config.h"
#include "worker/model/flops.h"
#include "worker/plan/plan.h"
#include "worker/search/search.h"
#include "worker/train/result.h"

namespace batchdist::worker {

/// What the run knows besides the config, the plan and the training result.
struct RunInfo {
  int64_t world_size = 1;
  int64_t hosts = 1;
  std::string backend;
  std::string device;
  std::string torch_version;
  std::string data_origin;
  int64_t validation_samples = 0;     ///< 0: eval_loss and the eval_<metric>s mean nothing
  int64_t train_samples = 0;
  int64_t classes = 0;
  std::string cpu_blas;               ///< CPU ranks: the BLAS of Note [host blas], or empty
  bool channels_last = false;         ///< Note [channels last]: the layout the run used
  Yardstick yardstick;                ///< Note [mfu]
  std::string model_path;             ///< where rank 0 saved the model
  std::string stopped_by;             ///< "SIGTERM" when a signal ended the run early
  std::optional<SearchResult> search; ///< when the batch was searched (or cached)
  std::string resumed_path;           ///< the checkpoint this run continued, or empty
  int64_t resumed_step = 0;
  int64_t resumed_world = 0;          ///< world size when it was written
  std::vector<std::string> diagnosis; ///< the end-of-run findings (diagnose())
};

nlohmann::ordered_json runReport(const Config& cfg, const Plan& plan, const TrainResult& result,
                                 const RunInfo& info);

/// The report of a run that a stop signal ended during the batch search, before
/// any training (`search`, or `train` with per_gpu: auto): what ran where,
/// "completed": false, info.stopped_by, "stopped_during": "batch search", steps 0,
/// and the search's last candidate and seconds, in the same keys as runReport's.
nlohmann::ordered_json searchStoppedReport(const Config& cfg, const RunInfo& info,
                                           int64_t last_per_gpu, double search_seconds);

/// metrics.jsonl: one JSON object per line, per logging interval ("kind": "step")
/// and per epoch ("kind": "epoch", with the evaluation), for other plotting tools.
std::string metricsJsonl(const TrainResult& result);

}  // namespace batchdist::worker
