#pragma once
// The search cache: one JSON file holding the key of what was searched and the
// result, so a second run with the same model, data, batch settings, hardware and
// world size skips the search.

#include <optional>
#include <string>
#include <vector>

#include "worker/config/config.h"
#include "worker/search/search.h"

namespace batchdist::worker {

/// What the cached result depends on besides the config (DataInfo's shape part).
struct SearchCacheInputs {
  int64_t train_size = 0;
  std::vector<int64_t> sample_shape;
  std::string task;      ///< Note [task choice]: the objective ...
  int64_t outputs = 0;   ///< ... and the model head's width
  int64_t world = 1;
  std::string device;
  std::vector<double> budgets;  ///< every rank's memory budget (MB)
};

/// Everything the result depends on: the resolved model, optim, search and batch
/// sections (not per_gpu: that is what is searched), data shape and size,
/// precision, resize, device, world size, every rank's budget, the torch version
/// and dist.shard.
std::string searchCacheKey(const Config& cfg, const SearchCacheInputs& in);

/// What readSearchCache found.
struct CacheLookup {
  std::optional<SearchResult> result;  ///< set on a hit
  std::string problem;  ///< non-empty when the file exists but was damaged (why; it is ignored)
  std::string note;     ///< set when training marks changed the choice (markSearchCacheOom)
};

/// A training step that ran out of memory with a (cached) per-GPU batch.
struct TrainingOom {
  int64_t per_gpu = 0;
  int64_t accum = 0;
  int64_t step = 0;  ///< 1-based global step
  int64_t rank = 0;
  double peak_mb = 0;
};

/// Reads `path`; a missing file or another key is a miss. A damaged file or
/// entry (not JSON, missing fields, a chosen batch that is not positive or not
/// among the candidates) is a miss with `problem` naming the file and the fault.
/// An entry marked by markSearchCacheOom counts every candidate at or above the
/// smallest per-GPU batch that ran out of memory in training as failed (in the
/// adapt range too) and chooses again among the rest (`note` says so); none left
/// is a miss.
CacheLookup readSearchCache(const std::string& path, const std::string& key);

/// Note [oom back-off]: marks the entry under `key` in `path` (if it is there)
/// with out-of-memory back-offs from training, so the next run does not take the
/// same batch blindly. Throws Error naming the file when it cannot be written.
void markSearchCacheOom(const std::string& path, const std::string& key,
                        const std::vector<TrainingOom>& ooms);

/// Writes the entry atomically (throws Error naming the file on failure).
void writeSearchCache(const std::string& path, const std::string& key, const SearchResult& r);

}  // namespace batchdist::worker
