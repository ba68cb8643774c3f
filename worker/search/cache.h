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
  int64_t classes = 0;
  int64_t world = 1;
  std::string device;
  std::vector<double> budgets;  ///< every rank's memory budget (MB)
};

/// Everything the result depends on: the resolved model, optim, search and batch
/// sections (not per_gpu: that is what is searched), data shape and size,
/// precision, resize, device, world size, every rank's budget and the torch version.
std::string searchCacheKey(const Config& cfg, const SearchCacheInputs& in);

/// What readSearchCache found.
struct CacheLookup {
  std::optional<SearchResult> result;  ///< set on a hit
  std::string problem;  ///< non-empty when the file exists but was damaged (why; it is ignored)
};

/// Reads `path`; a missing file or another key is a miss. A damaged file or
/// entry (not JSON, missing fields, a chosen batch that is not positive or not
/// among the candidates) is a miss with `problem` naming the file and the fault.
CacheLookup readSearchCache(const std::string& path, const std::string& key);

/// Writes the entry atomically (throws Error naming the file on failure).
void writeSearchCache(const std::string& path, const std::string& key, const SearchResult& r);

}  // namespace batchdist::worker
