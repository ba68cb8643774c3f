#pragma once
// The run's batch search: the coordinated search or its cache entry, and rank
// 0's search artifacts (search.json, search.svg, the cache's out-of-memory marks).

#include <string>

#include "collective/communicator.h"
#include "worker/common/console.h"
#include "worker/run.h"
#include "worker/search/search.h"

namespace batchdist::worker {

/// Where the search result of this run is cached.
struct CacheEntry {
  std::string path;
  std::string key;
};

/// Runs (or reads from the cache) the coordinated batch search. Collective.
/// `cfg`: the run's config as the resume left it (Note [run decisions]).
SearchResult searchBatch(const RunRequest& req, const RunSetup& s, const Config& cfg,
                         collective::Communicator& comm, Console& console, CacheEntry* entry);

/// search.json, search.svg, and the search's table on stdout (unless quiet). Rank 0.
void writeSearchArtifacts(const RunRequest& req, const SearchResult& result);

/// Note [oom back-off]: the search cache entry this run used learns of every
/// back-off, so the next run does not take the same batch blindly. Rank 0.
void markCache(const CacheEntry& cache, const TrainResult& result);

}  // namespace batchdist::worker
