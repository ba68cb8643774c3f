#include "worker/run_search.h"

#include <filesystem>
#include <iostream>

#include "common/error.h"
#include "worker/common/files.h"
#include "worker/common/util.h"
#include "worker/search/cache.h"
#include "worker/search/output.h"
#include "worker/train/step/step_measurer.h"

namespace batchdist::worker {
namespace fs = std::filesystem;

namespace {

/// The cached search result, if rank 0 has one for this setup (collective: rank
/// 0 reads, every rank gets the whole result). Every rank parses the same text:
/// the adaptive batch decides on each rank from the result's samples/s figures
/// (Note [adaptive training]), and ranks holding different figures would choose
/// different global batches.
std::optional<SearchResult> lookupCache(const RunRequest& req, collective::Communicator& comm,
                                        const std::string& path,
                                        const std::string& key, Console& console) {
  std::optional<SearchResult> cached;
  std::string text;
  if (comm.rank() == 0 && !req.research) {
    const auto found = readSearchCache(path, key);
    if (!found.problem.empty()) {
      std::cerr << strCat("batchdist: warning: ignoring the search cache: ", found.problem,
                          "; searching again\n")
                << std::flush;
    }
    if (!found.note.empty()) {
      console.line(strCat("batch search: ", path, " is marked: ", found.note));
    }
    if (found.result) text = searchJson(*found.result).dump();
  }
  text = comm.broadcast(text, 0);
  if (text.empty()) return std::nullopt;
  cached = searchFromJson(nlohmann::json::parse(text));
  cached->cached = true;
  console.line(strCat("batch search: cached result for this model, data, device and world size in ",
                      path, " (--research to measure again)"));
  return cached;
}

/// Note [search traces]: rank 0's line on what the search traced.
void searchTracesLine(const SearchResult& r, const std::string& dir, int world, Console& console) {
  int64_t traced = 0;
  for (const auto& c : r.candidates) traced += c.trace.empty() ? 0 : 1;
  console.line(strCat("profile: one step of ", traced, " of ", r.candidates.size(),
                      " search candidate(s) traced: ", dir, "/<candidate>/",
                      world > 1 ? " (one file per rank)" : "", "; search.json names them"));
}


}  // namespace

/// Runs (or reads from the cache) the coordinated batch search. Collective.
/// `cfg`: the run's config as the resume left it (Note [run decisions]).
SearchResult searchBatch(const RunRequest& req, const RunSetup& s, const Config& cfg,
                         collective::Communicator& comm, Console& console, CacheEntry* entry) {
  SearchTraceOptions trace{(fs::path(req.output) / "profile" / "search").string(), comm.backendName()};
  auto measurer = makeTrainStepMeasurer(cfg, comm, s.data, s.device, &req.faults,
                                        cfg.search.profile ? &trace : nullptr);
  SearchCacheInputs in;
  in.train_size = s.data.train.size();
  in.sample_shape = s.data.train.sample_shape;
  in.task = toString(s.task.kind);
  in.outputs = s.task.outputs;
  in.world = comm.size();
  in.device = measurer->deviceName();
  in.budgets = comm.allgather(measurer->memoryBudgetMb());
  const auto key = searchCacheKey(cfg, in);
  const std::string cache_path = cfg.search.cache.empty()
                                     ? (fs::path(req.output) / "search_cache.json").string()
                                     : cfg.search.cache;
  *entry = {cache_path, key};
  if (auto cached = lookupCache(req, comm, cache_path, key, console)) {
    cached->tokens_per_sample = tokensPerSample(cfg);  // an entry from before it was kept
    explainChoice(*cached);  // its why as a fresh search words it: tokens/s on token data
    if (cfg.search.profile) {
      console.line("profile: the search was read from the cache, so no candidate was traced "
                   "(--research measures it again)");
    }
    return *cached;
  }
  BatchSearch search(cfg, comm, *measurer, s.data.train.size(), s.has_bn,
                     [&req] { return req.stop_signal() != 0; });
  auto result = search.run(&console);
  if (comm.rank() == 0) writeSearchCache(cache_path, key, result);
  if (cfg.search.profile) searchTracesLine(result, trace.dir, comm.size(), console);
  return result;
}

void writeSearchArtifacts(const RunRequest& req, const SearchResult& result) {
  writeFileAtomic((fs::path(req.output) / "search.json").string(), searchJson(result).dump(2) + "\n");
  writeFileAtomic((fs::path(req.output) / "search.svg").string(), searchSvg(result));
  if (!req.quiet) std::cout << searchTable(result) << std::flush;
}

/// Note [oom back-off]: the search cache entry this run used learns of every
/// back-off, so the next run does not take the same batch blindly. Rank 0.
void markCache(const CacheEntry& cache, const TrainResult& result) {
  if (cache.path.empty() || result.oom_backoffs.empty()) return;
  std::vector<TrainingOom> ooms;
  for (const auto& b : result.oom_backoffs) {
    ooms.push_back({b.from_per_gpu, b.from_accum, b.step, b.ranks.empty() ? 0 : b.ranks.front(),
                    b.peak_mb});
  }
  try {
    markSearchCacheOom(cache.path, cache.key, ooms);
  } catch (const Error& e) {
    std::cerr << strCat("batchdist: warning: could not mark the search cache: ", e.what(), "\n")
              << std::flush;
  }
}

}  // namespace batchdist::worker
