#pragma once
// The `data` verb: the input pipeline alone, no model, on every rank (Note [loader]).

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "worker/config/config.h"
#include "worker/data/data.h"
#include "worker/data/pipeline.h"
#include "worker/plan/plan.h"

namespace batchdist::worker {

/// One rank's run of its training loader.
struct LoaderMeasurement {
  int rank = 0;
  double seconds = 0;      ///< wall time of the timed batches
  int64_t samples = 0;
  int64_t batches = 0;
  int64_t workers = 0;
  int64_t per_gpu = 0;
  double wait_s = 0;       ///< the consumer's wait for batches (all of `seconds` here: no model)
  StageSeconds stages;     ///< read, decode, transform: summed over threads
  int64_t errors = 0;      ///< bad samples skipped
  std::string output = "float";  ///< the batches timed: "uint8" (NHWC) or "float" (NCHW)
  double samplesPerSecond() const { return seconds > 0 ? samples / seconds : 0; }
  nlohmann::ordered_json json() const;
  static LoaderMeasurement fromJson(const nlohmann::json& j);
};

/// Runs this rank's shard of the training epochs through the loader as fast as it
/// can make batches, for about `seconds` (after one warm-up batch), with the
/// plan's per-GPU batch. Decoded sources: uint8 NHWC batches when `uint8_images`
/// (the pipeline's own output, as the CUDA path ships it), else float NCHW
/// normalised, as CPU training gets them (the conversion in the workers included).
/// `read_delay_us`: Note [fault plan]'s slow storage (0 outside the tests).
LoaderMeasurement measureLoader(const Config& cfg, const Dataset& train, const Plan& plan, int rank,
                                double seconds, bool uint8_images = true,
                                int64_t read_delay_us = 0);

/// The `data` verb's report over all ranks: text (a line per rank and the total)
/// or one JSON object (`samples_per_s` total, `per_rank`, `workers`, ...). With
/// `tokens_per_sample` > 0 (the plan's: Note [tokens per sample] in
/// worker/plan/plan.h) tokens/s beside every samples/s (`tokens_per_s`), and the
/// text says what a sample counts (model.seq_len, as training counts it).
std::string dataReport(const std::vector<LoaderMeasurement>& ranks, const DataSplit& data,
                       const Config& cfg, bool json, int64_t tokens_per_sample = 0);

}  // namespace batchdist::worker
