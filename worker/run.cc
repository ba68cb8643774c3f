#include "worker/run.h"

#include <sched.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>

#include "common/error.h"
#include "collective/process_group.h"
#include "collective/torch_compat.h"
#include "worker/common/heartbeat.h"
#include "worker/common/console.h"
#include "worker/common/files.h"
#include "worker/common/util.h"
#include "worker/device.h"
#include "worker/join.h"
#include "worker/model/model.h"
#include "worker/model/precision.h"
#include "worker/report/diagnose.h"
#include "worker/report/html.h"
#include "worker/report/metrics_log.h"
#include "worker/report/tensorboard.h"
#include "worker/report/report.h"
#include "worker/search/cache.h"
#include "worker/search/output.h"
#include "worker/search/search.h"
#include "worker/train/checkpoint.h"
#include "worker/train/step_measurer.h"
#include "worker/train/memory.h"
#include "worker/train/trainer.h"
#include "worker/train/update_strategy.h"

namespace batchdist::worker {
namespace fs = std::filesystem;

int usableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

namespace {

/// train.progress with `auto` resolved for rank 0's stdout (Note [progress output]).
ProgressStyle progressStyle(ProgressMode mode) {
  switch (mode) {
    case ProgressMode::kBar: return ProgressStyle::kBar;
    case ProgressMode::kLines: return ProgressStyle::kLines;
    case ProgressMode::kOff: return ProgressStyle::kOff;
    case ProgressMode::kAuto: break;
  }
  return progressForStdout();
}

/// Every rank must train the same thing: compares each rank's resolved config
/// with rank 0's, key by key, skipping the keys a rank may set for itself.
/// Collective; throws ConfigError on every rank.
void checkConfigsAgree(const Config& cfg, collective::Communicator& comm) {
  nlohmann::ordered_json mine = cfg.resolved;
  for (const auto& key : Config::perRankKeys()) {
    const auto dot = key.find('.');
    if (mine.contains(key.substr(0, dot))) mine[key.substr(0, dot)].erase(key.substr(dot + 1));
  }
  const std::string text = mine.dump();
  const auto root = nlohmann::ordered_json::parse(comm.broadcast(text, 0));
  std::string diff;
  if (root != mine) {
    for (const auto& [section, keys] : mine.items()) {
      for (const auto& [key, value] : keys.items()) {
        const auto theirs = root.value(section, nlohmann::ordered_json::object()).value(key, nlohmann::ordered_json());
        if (theirs != value) {
          diff += strCat(diff.empty() ? "" : "; ", section, ".", key, " = ", value.dump(),
                         " here, ", theirs.dump(), " on rank 0");
        }
      }
    }
    if (diff.empty()) diff = "the set of keys differs (different batchdist versions?)";
  }
  if (comm.any(!diff.empty())) {
    throw ConfigError(diff.empty() ? std::string("another rank's config differs from rank 0's "
                                                 "(see its message)")
                                   : "config differs from rank 0's: " + diff +
                                         ". Every rank must train the same model on the same "
                                         "data; launch them with the same file and --set options");
  }
}

/// The job's connection: rendezvous over MPI, then the process group.
struct Connection {
  std::unique_ptr<collective::Communicator> comm;
  std::string store_address;
  int threads = 1;
};

Connection connect(const RunSetup& s, const RankPlace& place) {
  Connection c;
  c.threads = s.cfg.train.threads > 0 ? static_cast<int>(s.cfg.train.threads)
                                      : std::max(1, usableCpus() / place.local_size);
  torch::set_num_threads(c.threads);
  auto joined = joinProcessGroup(place, s.device, toString(s.cfg.dist.backend), s.cfg.dist.timeout_s,
                                 s.cfg.dist.interface);
  c.comm = std::move(joined.comm);
  c.store_address = std::move(joined.store_address);
  return c;
}

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

/// Where the search result of this run is cached.
struct CacheEntry {
  std::string path;
  std::string key;
};

/// Runs (or reads from the cache) the coordinated batch search. Collective.
SearchResult searchBatch(const RunRequest& req, const RunSetup& s, collective::Communicator& comm,
                         Console& console, CacheEntry* entry) {
  SearchTraceOptions trace{(fs::path(req.output) / "profile" / "search").string(), comm.backendName()};
  auto measurer = makeTrainStepMeasurer(s.cfg, comm, s.data, s.device, &req.faults,
                                        s.cfg.search.profile ? &trace : nullptr);
  SearchCacheInputs in;
  in.train_size = s.data.train.size();
  in.sample_shape = s.data.train.sample_shape;
  in.task = toString(s.task.kind);
  in.outputs = s.task.outputs;
  in.world = comm.size();
  in.device = measurer->deviceName();
  in.budgets = comm.allgather(measurer->memoryBudgetMb());
  const auto key = searchCacheKey(s.cfg, in);
  const std::string cache_path = s.cfg.search.cache.empty()
                                     ? (fs::path(req.output) / "search_cache.json").string()
                                     : s.cfg.search.cache;
  *entry = {cache_path, key};
  if (auto cached = lookupCache(req, comm, cache_path, key, console)) {
    cached->tokens_per_sample = tokensPerSample(s.cfg);  // an entry from before it was kept
    explainChoice(*cached);  // its why as a fresh search words it: tokens/s on token data
    if (s.cfg.search.profile) {
      console.line("profile: the search was read from the cache, so no candidate was traced "
                   "(--research measures it again)");
    }
    return *cached;
  }
  BatchSearch search(s.cfg, comm, *measurer, s.data.train.size(), s.has_bn,
                     [&req] { return req.stop_signal() != 0; });
  auto result = search.run(&console);
  if (comm.rank() == 0) writeSearchCache(cache_path, key, result);
  if (s.cfg.search.profile) searchTracesLine(result, trace.dir, comm.size(), console);
  return result;
}

void writeSearchArtifacts(const RunRequest& req, const SearchResult& result) {
  writeFileAtomic((fs::path(req.output) / "search.json").string(), searchJson(result).dump(2) + "\n");
  writeFileAtomic((fs::path(req.output) / "search.svg").string(), searchSvg(result));
  if (!req.quiet) std::cout << searchTable(result) << std::flush;
}

/// What ran, and where: the fields every report opens with.
RunInfo runInfo(const RankPlace& place, const RunSetup& s, collective::Communicator& comm) {
  RunInfo info;
  info.world_size = place.size;
  info.hosts = place.host_count;
  info.backend = comm.backendName();
  info.device = s.device.str();
  info.torch_version = compat::torchVersion();
  info.data_origin = s.data.origin;
  info.cpu_blas = s.blas.name;
  return info;
}

/// The report's figures of a finished (or stopped) training run.
RunInfo trainedRunInfo(const RankPlace& place, const RunSetup& s, collective::Communicator& comm,
                       const TrainResult& result, const std::optional<SearchResult>& searched,
                       const std::optional<CheckpointCheck>& resumed, int sig,
                       const std::string& model_path) {
  RunInfo info = runInfo(place, s, comm);
  info.validation_samples = s.data.val.size();
  info.train_samples = s.data.train.size();
  info.classes = s.data.train.classes;
  info.model_path = model_path;
  if (!result.completed) {
    info.stopped_by = result.failure.empty() ? strCat("SIG", sigabbrev_np(sig ? sig : SIGTERM))
                                             : std::string("out of memory");
  }
  info.search = searched;
  if (resumed) {
    info.resumed_path = resumed->path;
    info.resumed_step = resumed->manifest.step;
    info.resumed_world = resumed->manifest.plan.world_size;
  }
  const auto name = s.device.is_cuda() ? compat::cudaDeviceName(s.device.index()) : "cpu";
  info.diagnosis = diagnose(s.cfg, result, s.device.is_cuda(), name, info.train_samples,
                            s.plan.tokens_per_sample);
  if (searched && !searched->data_bound.empty()) info.diagnosis.push_back(searched->data_bound);
  return info;
}

/// report.json (and --report), then report.html from the documents as written.
void writeReports(const RunRequest& req, const Config& cfg, const Plan& plan,
                  const TrainResult& result, const RunInfo& info,
                  const std::optional<SearchResult>& searched) {
  // Paths from the command line (--output, the config's directory) may hold bytes
  // that are not UTF-8; the report must still be written once the run is done.
  // The split training ended with (Note [oom back-off]: it may have backed off).
  const auto report_json = runReport(cfg, plan, result, info);
  const auto report =
      report_json.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  writeFileAtomic((fs::path(req.output) / "report.json").string(), report);
  if (!req.report.empty()) writeFileAtomic(req.report, report);
  // The page reads the documents (the search's as search.json has it), so what it
  // shows is what the files hold; invalid UTF-8 is replaced as in the report.
  const auto page_report = nlohmann::ordered_json::parse(report);
  const auto page_search =
      searched ? nlohmann::ordered_json::parse(searchJson(*searched).dump(
                     -1, ' ', false, nlohmann::ordered_json::error_handler_t::replace))
               : nlohmann::ordered_json();
  writeFileAtomic((fs::path(req.output) / "report.html").string(),
                  reportHtml(page_report, page_search, result.metrics));
}

/// The closing "system:" line: the metrics over the run, or that a run shorter
/// than report.sample_s took no sample (it said nothing); "" without metrics.
std::string systemLine(const TrainResult& result, double sample_s) {
  if (const auto text = systemText(acrossRanks(result.system)); !text.empty()) {
    const auto n = result.system.size();
    return strCat("system", n > 1 ? strCat(" (the ", n, " ranks' mean; memory and temperature: "
                                           "the highest)")
                                  : std::string(),
                  ": ", text);
  }
  int64_t taken = 0;
  for (const auto& x : result.system) taken += x.run.samples;
  if (result.system.empty() || taken > 0) return "";
  return strCat("system: no sample was taken: training ended before the first one (every ", sample_s,
                " s, report.sample_s)");
}

/// Rank 0's closing lines: where the time went, the diagnosis, the noise scale, the outcome.
void summaryLines(const RunRequest& req, const RunSetup& s, const Trainer& trainer,
                  const TrainResult& result, const RunInfo& info, Console& console) {
  const auto& t = result.time;
  const double tt = std::max(1e-9, t.total());
  console.line(strCat("time: data wait ", formatFixed(100 * t.data_wait / tt, 1), " %, compute ",
                      formatFixed(100 * t.compute / tt, 1), " %, communication ",
                      formatFixed(100 * t.comm / tt, 1), " %, waiting for slower ranks ",
                      formatFixed(100 * t.skew / tt, 1), " % of step time (rank 0)"));
  if (const auto line = systemLine(result, s.cfg.report.sample_s); !line.empty()) console.line(line);
  for (const auto& f : info.diagnosis) console.line("diagnosis: " + f);
  if (result.noise.b_simple > 0) {
    // Note [tokens per sample]: on token windows B_simple and G in tokens too.
    const int64_t tokens = trainer.plan().tokens_per_sample;
    const double b = result.noise.b_simple;
    console.line(strCat("gradient noise scale: B_simple ~ ", noiseScaleText(b), " samples (",
                        tokens > 0 ? strCat(noiseScaleText(b * static_cast<double>(tokens)),
                                            " tokens, ")
                                   : std::string(),
                        "smoothed), global batch ", trainer.plan().global,
                        tokens > 0 ? strCat(" (", trainer.plan().tokensPerStep(), " tokens)")
                                   : std::string()));
  }
  console.line(strCat(result.completed ? "done: " : "stopped early: ", result.steps,
                      " steps, ",
                      result.progress >= 0
                          ? strCat(formatFixed(result.progress, 1), " at G0 = ", s.plan.global,
                                   " (batch.adapt), ")
                          : std::string(),
                      s.data.val.size() > 0
                          ? strCat(trainer.task().describe(result.eval_metrics), ", ")
                          : std::string("no validation set, "),
                      static_cast<int64_t>(result.samples_per_s), " samples/s",
                      tokenRate(result.samples_per_s, trainer.plan().tokens_per_sample), ", ",
                      formatDuration(result.wall_s), "; wrote ", req.output,
                      "/report.json, report.html, metrics.jsonl and model.pt"));
}

/// Rank 0's artifacts and summary lines after training.
void finishRun(const RunRequest& req, const RankPlace& place, const RunSetup& s,
               collective::Communicator& comm, Trainer& trainer, const TrainResult& result,
               const std::optional<SearchResult>& searched,
               const std::optional<CheckpointCheck>& resumed, int sig, Console& console) {
  const std::string model_path = (fs::path(req.output) / "model.pt").string();
  writeFileAtomic(model_path, trainer.model().serialize());
  const RunInfo info =
      trainedRunInfo(place, s, comm, result, searched, resumed, sig, model_path);
  writeReports(req, s.cfg, trainer.plan(), result, info, searched);
  summaryLines(req, s, trainer, result, info, console);
}

/// Rank 0's report of a run stopped during the batch search (nothing trained, so
/// no model, metrics or page): report.json, and --report when given.
void finishStoppedSearch(const RunRequest& req, const RankPlace& place, const RunSetup& s,
                         collective::Communicator& comm, int64_t last_per_gpu, double seconds,
                         int sig) {
  RunInfo info = runInfo(place, s, comm);
  info.stopped_by = strCat("SIG", sigabbrev_np(sig ? sig : SIGTERM));
  const auto report =
      searchStoppedReport(s.cfg, info, last_per_gpu, seconds)
          .dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) +
      "\n";
  writeFileAtomic((fs::path(req.output) / "report.json").string(), report);
  if (!req.report.empty()) writeFileAtomic(req.report, report);
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

/// The signal any rank received (all learn it; collective).
int agreedSignal(const RunRequest& req, collective::Communicator& comm) {
  return static_cast<int>(
      comm.allreduce(static_cast<double>(req.stop_signal()), collective::ReduceOp::kMax));
}

bool resumeRequested(const RunRequest& req, const Config& cfg) {
  if (req.search_only) return false;
  return !req.resume.empty() || cfg.checkpoint.resume == ResumeMode::kAuto;
}

/// Rank 0's choice of checkpoint for --resume / checkpoint.resume (auto: the
/// newest valid one in the checkpoint dir; PATH: that checkpoint, or the newest
/// valid one in that directory). Prints what it skipped and why.
std::optional<CheckpointCheck> findResumeCheckpoint(const RunRequest& req, const RunSetup& s,
                                                    std::string* problem) {
  const std::string want = req.resume.empty() ? "auto" : req.resume;
  std::vector<std::string> rejected;
  std::optional<CheckpointCheck> found;
  std::error_code ec;
  if (want == "auto") {
    found = findLatestCheckpoint(s.checkpoint_dir, &rejected);
  } else if (fs::exists(fs::path(want) / "manifest.json", ec)) {
    auto c = verifyCheckpoint(want);
    if (c.problem.empty()) found = c;
    else *problem = strCat(want, " cannot be loaded: ", c.problem);
  } else if (fs::is_directory(want, ec)) {
    found = findLatestCheckpoint(want, &rejected);
    if (!found) *problem = strCat("no valid checkpoint in ", want);
  } else if (fs::exists(want, ec)) {  // Note [input files are regular files]: a FIFO too
    const InputFile f = openInputFile(want);
    *problem = strCat(want, ": is ", f.kind.empty() ? std::string("a file") : f.kind,
                      ", not a checkpoint (a step-* directory holding manifest.json, or a "
                      "directory of them)");
  } else {
    *problem = strCat(want, ": no such checkpoint (a step-* directory holding manifest.json, or a "
                            "directory of them)");
  }
  for (const auto& r : rejected) {
    std::cerr << strCat("batchdist: warning: resume: not loading checkpoint ", r,
                        found ? strCat("; taking the older ", found->path) : std::string(), "\n")
              << std::flush;
  }
  return found;
}

/// The checkpoint this run continues, or none (a fresh start): rank 0 decides and
/// says which in one line; every rank gets the manifest. Collective. Throws
/// ConfigError for a --resume PATH that cannot be loaded.
std::optional<CheckpointCheck> pickCheckpoint(const RunRequest& req, const RunSetup& s,
                                              collective::Communicator& comm, Console& console) {
  if (!resumeRequested(req, s.cfg)) return std::nullopt;
  std::string problem, path, manifest;
  if (comm.rank() == 0) {
    const auto found = findResumeCheckpoint(req, s, &problem);
    if (found) {
      path = found->path;
      manifest = found->text;
      const auto& p = found->manifest.plan;
      console.line(strCat("resume: continuing from ", path, " (step ", found->manifest.step,
                          " of ", p.total_steps, ", written by ", p.world_size,
                          " rank(s); now ", comm.size(), ")"));
    } else if (problem.empty()) {
      console.line(strCat("resume: no valid checkpoint in ", s.checkpoint_dir, "; starting fresh"));
    }
  }
  problem = comm.broadcast(problem, 0);
  if (!problem.empty()) throw ConfigError(strCat("--resume: ", problem));
  manifest = comm.broadcast(manifest, 0);
  if (manifest.empty()) return std::nullopt;
  CheckpointCheck c;
  c.path = comm.broadcast(path, 0);
  c.text = std::move(manifest);
  c.manifest = readManifest(nlohmann::ordered_json::parse(c.text));  // as rank 0 read it
  return c;
}

/// World sizes over which global batch `g` splits into micro-batches of at least `min_m`.
std::string worldSizesFor(int64_t g, int64_t min_m) {
  std::string out;
  for (int64_t w = 1; w <= std::min<int64_t>(g, 4096); ++w) {
    if (g % w == 0 && g / w >= min_m) out += strCat(out.empty() ? "" : ", ", w);
  }
  return out;
}

/// Note [checkpoint]: a resumed run keeps the checkpoint's global batch G (and so
/// the steps per epoch, the sample order and the LR schedule); the per-GPU batch m
/// and accumulation a are planned again for this world size: the same m as before
/// on the same world size, the search's choice when per_gpu is auto, else the
/// largest m <= the checkpoint's (it fitted) that divides G / W. Edits s.cfg.batch.
void planResumedBatch(RunSetup& s, const CheckpointCheck& ckpt, int world) {
  const auto& p = ckpt.manifest.plan;
  const int64_t g = p.global, then_world = p.world_size, then_m = p.per_gpu;
  const int64_t min_m = s.has_bn ? s.cfg.batch.min_per_gpu : 1;
  if (g % world != 0 || g / world < min_m) {
    throw ConfigError(strCat("cannot resume ", ckpt.path, " on ", world, " rank(s): its global "
                             "batch ", g, " (kept on resume) does not split into equal "
                             "micro-batches", min_m > 1 ? strCat(" of at least ", min_m) : "",
                             " over ", world, " ranks; world sizes that work: ",
                             worldSizesFor(g, min_m)));
  }
  auto& b = s.cfg.batch;
  b.global = g;
  b.global_auto = false;
  b.accum = 0;
  if (world == then_world || !b.per_gpu_auto) {
    int64_t m = world == then_world ? then_m : std::min(then_m, g / world);
    while ((g / world) % m != 0) --m;
    b.per_gpu = m;
    b.per_gpu_auto = false;
  }
  s.cfg.resolved["batch"]["global"] = g;
  s.cfg.resolved["batch"]["accum"] = nullptr;
}

/// The checkpoint this run continues (or none), checked against this run's config,
/// with the batch planned for this world size (s.plan, unless the search must
/// pick the per-GPU batch for a new world size). Collective. Throws ConfigError.
std::optional<CheckpointCheck> prepareResume(const RunRequest& req, RunSetup& s,
                                             collective::Communicator& comm, Console& console,
                                             std::optional<SearchResult>* searched) {
  auto resumed = pickCheckpoint(req, s, comm, console);
  if (!resumed) {
    if (!s.plan_error.empty()) throw ConfigError(s.plan_error);
    return resumed;
  }
  checkResumable(resumed->manifest, s.cfg, resumed->path);
  planResumedBatch(s, *resumed, comm.size());
  if (s.cfg.batch.per_gpu_auto) return resumed;  // searched again for this world size
  // Note [lever search]: on the same world the levers the checkpoint's run chose (none and
  // off for a checkpoint from before the levers were recorded).
  if (const Levers asked = configLevers(s.cfg); hasAutoLevers(asked)) {
    Levers then = resumed->manifest.levers;
    if (asked.shard != Shard::kAuto) then.shard = asked.shard;
    if (asked.recompute != Recompute::kAuto) then.recompute = asked.recompute;
    applyLevers(s.cfg, then);
    console.line(strCat("levers: ", leversText(then), " (as the checkpoint's run chose for ",
                        autoLeversText(asked), ")"));
  }
  s.plan = makePlan(s.cfg, comm.size(), s.data.train.size(), s.has_bn);
  if (const int64_t m = resumed->manifest.searched_per_gpu; m > 0 && m == s.plan.per_gpu) {
    searched->emplace();  // the search result the checkpoint's run found for this world size
    (*searched)->chosen = m;
    (*searched)->cached = true;
  }
  return resumed;
}

}  // namespace

namespace {

/// Note [program parts]: the program's module and data into the config; a config
/// naming model.name or data.name: program without them is refused.
void attachProgram(const RunRequest& req, Config& cfg) {
  if (cfg.model.name == ModelName::kProgram) {
    if (!req.program_module) throw ConfigError(programOnlyMessage("model.name"));
    cfg.model.program = req.program_module;
  }
  if (cfg.data.name == DataName::kProgram) {
    if (!req.program_data) throw ConfigError(programOnlyMessage("data.name"));
    cfg.data.program = req.program_data;
  }
}

}  // namespace

Config loadRunConfig(const RunRequest& req) {
  auto cfg = req.config_path.empty()
                 ? parseConfig("{}", "the program's settings", req.sets, req.sets_from)
                 : loadConfig(req.config_path, req.sets, req.sets_from);
  attachProgram(req, cfg);
  return cfg;
}

RunSetup prepareRun(const RunRequest& req, const RankPlace& place) {
  RunSetup s;
  s.cfg = loadRunConfig(req);
  if (place.rank == 0) {
    // Before anything long: a run whose results cannot be saved is not started.
    checkWritableDirectory(req.output, "the results (--output)");
    if (!req.report.empty()) checkWritableFile(req.report, "the report (--report)");
    if (!s.cfg.search.cache.empty()) checkWritableFile(s.cfg.search.cache, "the search cache (search.cache)");
  }
  s.device = chooseDevice(s.cfg, probeGpus(place.host), place.host, place.local_rank,
                          place.local_size);
  if (!s.device.is_cuda()) configureHostAllocator();  // Note [host allocator]
  // An unavailable backend is refused here, before any rendezvous.
  collective::resolveBackend(toString(s.cfg.dist.backend), s.device);
  checkPrecision(s.cfg.train.precision, s.device, s.cfg.source);
  s.has_bn = modelHasBatchNorm(s.cfg.model, s.cfg.base_dir);
  s.checkpoint_dir = s.cfg.checkpoint.dir.empty()
                       ? (fs::path(req.output) / "checkpoints").string()
                       : s.cfg.checkpoint.dir;
  return s;
}

void prepareData(const RunRequest& req, const RankPlace& place, RunSetup& s) {
  DataContext data_ctx;
  data_ctx.from_rank0 = place.from_rank0;
  data_ctx.cache_dir = (fs::path(req.output) / "cache").string();
  if (place.rank == 0 && !req.quiet) {
    data_ctx.note = [](const std::string& line) { std::cout << line << "\n" << std::flush; };
  }
  if (place.rank == 0) {  // bad files and empty classes are said even with -q
    data_ctx.warn = [size = place.size](const std::string& line) {
      std::cerr << strCat("[rank 0/", size, "] warning: ", line, "\n") << std::flush;
    };
  }
  data_ctx.module_targets = trainsModuleLoss(s.cfg);  // Note [module loss]
  s.data = loadData(s.cfg.data, s.cfg.train.seed, s.cfg.base_dir, data_ctx);
  s.task = chooseTask(s.cfg, s.data);
  if (data_ctx.note) {
    data_ctx.note(strCat("task: ", toString(s.task.kind), " (", s.task.why, ")",
                         s.task.outputs > 0 ? strCat(", ", s.task.outputs, " output",
                                                     s.task.outputs == 1 ? "" : "s")
                                            : std::string()));
  }
  // Note [loader]: auto threads are this rank's share of the host's cores.
  s.cfg.data.workers = resolveWorkers(s.cfg.data, usableCpus(), place.local_size);
  s.cfg.data.workers_auto = false;
  if (!req.search_only && !s.cfg.batch.per_gpu_auto) {
    try {
      s.plan = makePlan(s.cfg, place.size, s.data.train.size(), s.has_bn);
    } catch (const ConfigError& e) {
      if (!resumeRequested(req, s.cfg)) throw;
      s.plan_error = e.what();  // a checkpoint's global batch may still split over this world
    }
  }
}

/// Note [phases]: rank 0's wall time per phase of a run, written to
/// OUTPUT/phases.json at its very end (bench/scale.sh reads it to show how each
/// phase grows with the world size). `done_unix_s` lets the caller time the
/// shutdown that follows (the process group, MPI_Finalize, mpirun).
struct PhaseClock {
  nlohmann::ordered_json phases = nlohmann::ordered_json::object();
  double mark = monotonicSeconds();
  /// Records the time since the last mark under `name`, and marks now.
  void lap(const char* name) {
    const double now = monotonicSeconds();
    phases[name] = now - mark;
    mark = now;
  }
  void write(const RunRequest& req, const RankPlace& place, const PhaseSeconds* train) {
    if (place.rank != 0) return;
    auto j = nlohmann::ordered_json::object();
    j["world_size"] = place.size;
    j["load"] = req.load_s;
    j["mpi_init"] = req.mpi_init_s;
    j["setup"] = req.setup_s;
    for (const auto& [k, v] : phases.items()) j[k] = v;
    if (train) {
      j["first_step"] = train->first_step;
      j["steady_step"] = train->steady_step;
      j["eval"] = train->eval;
      j["checkpoint_write"] = train->checkpoint;
    }
    j["done_unix_s"] = std::chrono::duration<double>(
                           std::chrono::system_clock::now().time_since_epoch()).count();
    try {
      writeFileAtomic((fs::path(req.output) / "phases.json").string(), j.dump(2) + "\n");
    } catch (const std::exception& e) {
      std::cerr << strCat("batchdist: warning: could not write phases.json: ", e.what(), "\n");
    }
  }
};

namespace {

// Note [run phases]: executeRun is five phases, each a short function over one
// RunState: connect (rendezvous, the configs agree, the banner), resolve the batch
// (a checkpoint to resume from, then the search or its cache: may end the run),
// build (the trainer, the adaptive batch, checkpoints, the metric sinks), train,
// and finish (rank 0's artifacts; the exit code, runExitCode()). Every phase is
// collective: every rank runs the same phases in the same order.
struct RunState {
  RunState(const RunRequest& q, const RankPlace& p, RunSetup& setup) : req(q), place(p), s(setup) {}
  const RunRequest& req;
  const RankPlace& place;
  RunSetup& s;
  PhaseClock clock;
  Connection conn;
  std::unique_ptr<Console> console;
  std::optional<SearchResult> searched;
  CacheEntry cache;
  std::optional<CheckpointCheck> resumed;
  bool lead() const { return place.rank == 0; }
  collective::Communicator& comm() { return *conn.comm; }
};

/// The console's line for a sharded update (Note [sharded optimizer], Note
/// [sharded gradients]); "" when not sharded.
std::string updateLine(const DistConfig& dist, collective::Communicator& comm) {
  const int w = comm.size();
  const bool native = comm.nativeFlatCollectives();
  if (shardsGradients(dist, w)) {
    return strCat("update: dist.shard: gradients (ZeRO-2): each micro-batch's gradients "
                  "reduce-scattered per ", dist.bucket_mb, " MB segment",
                  dist.overlap ? " as backward produces them" : " after backward (dist.overlap: false)",
                  native ? "" : " (emulated by an allreduce on gloo: 2x the bytes)",
                  ", each rank keeps 1/", w, " of the summed gradient and of the optimizer "
                  "state, one small allreduce of partial sums (clipping, fp16, LARS, noise "
                  "scale), then an all-gather");
  }
  if (dist.shard == Shard::kOptimizer || dist.shard == Shard::kGradients) {
    if (w == 1) {
      return strCat("update: dist.shard: ", toString(dist.shard), " on one rank: nothing to shard, "
                    "the rank keeps the whole gradient and optimizer state");
    }
    return strCat("update: dist.shard: optimizer (ZeRO-1): gradients allreduced, each rank keeps "
                  "and steps the optimizer state of 1/", w, " of the parameters, then an all-gather",
                  native ? "" : " (emulated by gloo's list all-gather)");
  }
  return "";
}

void connectPhase(RunState& r) {
  r.conn = connect(r.s, r.place);
  checkConfigsAgree(r.s.cfg, r.comm());
  r.clock.lap("rendezvous");
  auto& s = r.s;
  r.console = std::make_unique<Console>(r.lead() && !r.req.quiet, progressStyle(s.cfg.train.progress));
  r.console->line(strCat("batchdist ", BATCHDIST_VERSION, ": ", r.place.size, " rank(s) on ",
                         r.place.host_count, " host(s), backend ", r.comm().backendName(),
                         ", device ", s.device.str(), ", torch ", compat::torchVersion(), ", ",
                         r.conn.threads, " thread(s)/rank, store ", r.conn.store_address));
  if (!s.device.is_cuda()) s.blas = configureHostBlas(r.conn.threads);  // Note [host blas]
  if (const auto line = blasLine(s.blas); !line.empty()) r.console->line(line);
  r.console->line(strCat("data: ", s.data.origin, " -> ", s.data.train.size(), " train / ",
                         s.data.val.size(), " validation samples"));
  if (const auto line = updateLine(s.cfg.dist, r.comm()); !line.empty()) r.console->line(line);
}

/// The batch search (or its cache) and the plan it gives. Returns the exit code
/// when the run ends here: a stop signal during the search, or the `search` verb.
std::optional<int> searchPhase(RunState& r) {
  auto& s = r.s;
  const double search_t0 = monotonicSeconds();
  heartbeat::setPhase("search");  // Note [heartbeat]
  try {
    r.searched = searchBatch(r.req, s, r.comm(), *r.console, &r.cache);
    r.clock.lap("search");
    if (!r.searched->data_bound.empty()) r.console->line("search: " + r.searched->data_bound);
  } catch (const SearchStopped& e) {
    const int own_sig = r.req.stop_signal();
    const int sig = agreedSignal(r.req, r.comm());
    if (own_sig != 0) {
      std::cerr << strCat(r.place.tag(), " received SIG", sigabbrev_np(own_sig),
                          ": the batch search stopped cleanly ", e.what(),
                          "; rank 0 writes the report\n")
                << std::flush;
    }
    if (r.lead()) {
      finishStoppedSearch(r.req, r.place, s, r.comm(), e.lastPerGpu(),
                          monotonicSeconds() - search_t0, sig);
    }
    r.console->line(strCat("stop requested during the batch search: every rank stopped ", e.what(),
                           "; nothing was trained; wrote ", r.req.output, "/report.json"));
    r.comm().barrier();
    return 128 + (sig ? sig : SIGTERM);
  }
  if (r.lead()) {
    writeSearchArtifacts(r.req, *r.searched);
    if (s.cfg.report.tensorboard) {
      writeSearchEvents((fs::path(r.req.output) / "tensorboard" / "search").string(), *r.searched);
    }
  }
  // Note [lever search]: auto levers become the search's choice before anything is built.
  if (const Levers asked = configLevers(s.cfg); hasAutoLevers(asked)) {
    applyLevers(s.cfg, r.searched->chosen_levers);
    r.console->line(strCat("levers: ", leversText(r.searched->chosen_levers),
                           " (the search's choice for ", autoLeversText(asked), ")"));
  }
  // The plan (shards, lr scaling, warmup, BatchNorm minimum) follows the choice.
  s.plan = makePlan(s.cfg, r.place.size, s.data.train.size(), s.has_bn, r.searched->chosen);
  if (r.req.search_only) {
    if (r.console->enabled()) std::cout << planText(s.plan) << std::flush;
    r.comm().barrier();
    r.clock.write(r.req, r.place, nullptr);
    return 0;
  }
  return std::nullopt;
}

/// A checkpoint to resume from, then the per-GPU batch: the config's, the
/// checkpoint's, or the search's. Returns the exit code when the run ends here.
std::optional<int> resolveBatchPhase(RunState& r) {
  r.resumed = prepareResume(r.req, r.s, r.comm(), *r.console, &r.searched);
  r.clock.lap("resume_plan");
  // A resumed run was planned by prepareResume, unless the search picks m for a new world size.
  if (r.req.search_only || r.s.cfg.batch.per_gpu_auto) {
    if (auto code = searchPhase(r)) return code;
  }
  if (r.console->enabled()) std::cout << planText(r.s.plan) << std::flush;
  return std::nullopt;
}

/// Note [adaptive training]: the search's samples/s per per-GPU batch (a resume
/// on the same world size takes back its checkpoint's table instead).
void setUpAdaptive(RunState& r, Trainer& trainer) {
  const auto& s = r.s;
  auto space = adaptSpace(s.cfg, s.plan, s.has_bn);
  if (r.searched) {
    const auto table = adaptThroughput(*r.searched);
    space.throughput.insert(space.throughput.end(), table.begin(), table.end());
  }
  trainer.setAdaptive(space);
  const int64_t tokens = s.plan.tokens_per_sample;  // Note [tokens per sample]
  const bool warmup = s.cfg.batch.adapt == BatchAdapt::kWarmup;  // Note [batch-size warmup]
  r.console->line(strCat("adapt: batch.adapt: ", toString(s.cfg.batch.adapt), ": global batch from ",
                         space.g0, " up to ", space.ceiling,
                         tokens > 0 ? strCat(" (", space.g0 * tokens, " .. ", space.ceiling * tokens,
                                             " tokens)")
                                    : std::string(),
                         warmup ? ", doubled as B_simple reaches G0 x 2^k" : "",
                         ", re-decided every ", s.cfg.batch.adapt_every_steps,
                         " steps and at epoch ends",
                         s.plan.warmup_steps <= 0 ? std::string()
                         : s.cfg.batch.adapt_in_warmup
                             ? strCat(" (in the warmup's ", s.plan.warmup_steps,
                                      " steps too: batch.adapt_in_warmup)")
                             : strCat(" once the warmup's ", s.plan.warmup_steps, " steps are done"),
                         "; the run ends at ", s.plan.total_steps, " G0-equivalent steps",
                         s.cfg.batch.adapt_gain == AdaptGain::kLinear
                             ? " (a step at G counts G/G0 of them, the lr scales with G/G0: "
                               "batch.adapt_gain: linear)"
                             : ""));
}

/// Rank 0's streams while training: metrics.jsonl and TensorBoard's events.
struct MetricSinks {
  std::optional<MetricsLog> log;
  std::optional<EventFileWriter> events;
};

// Note [streamed metrics]: rank 0 appends as training goes; a resume continues the file.
// Note [tensorboard events]: a new event file, opening with START at the first step it holds.
void attachMetricSinks(RunState& r, Trainer& trainer, MetricSinks& sinks) {
  if (!r.lead()) return;
  const int64_t resumed_step = r.resumed ? r.resumed->manifest.step : -1;
  sinks.log.emplace((fs::path(r.req.output) / "metrics.jsonl").string(), resumed_step);
  if (r.s.cfg.report.tensorboard) {
    sinks.events.emplace((fs::path(r.req.output) / "tensorboard" / "train").string(), resumed_step + 1);
  }
  trainer.setMetricSink([&sinks](const MetricPoint& m) {
    sinks.log->append(m);
    if (sinks.events) appendMetrics(*sinks.events, m);
  });
}

/// Rank 0's artifacts and the run's exit code, after training.
int finishPhase(RunState& r, Trainer& trainer, const TrainResult& result) {
  // The signal may have reached only some ranks; all learn which (once per run).
  const int own_sig = r.req.stop_signal();
  const int sig = agreedSignal(r.req, r.comm());
  if (!result.completed && own_sig != 0) {
    std::cerr << strCat(r.place.tag(), " received SIG", sigabbrev_np(own_sig),
                        ": stopped cleanly after step ", result.steps,
                        "; rank 0 saves the model and the report\n")
              << std::flush;
  }
  if (r.lead()) {
    finishRun(r.req, r.place, r.s, r.comm(), trainer, result, r.searched, r.resumed, sig, *r.console);
    markCache(r.cache, result);
  }
  r.comm().barrier();
  r.clock.lap("artifacts");
  r.clock.write(r.req, r.place, &result.phases);
  if (!result.completed && !result.failure.empty() && r.lead()) {
    std::cerr << strCat(r.place.tag(), " error: ", result.failure, "\n") << std::flush;
  }
  return runExitCode(result, sig);
}

}  // namespace

int runExitCode(const TrainResult& result, int sig) {
  if (result.completed) return 0;
  if (!result.failure.empty()) return 1;
  // A stop whose checkpoint failed must not look like a clean, resumable stop.
  const bool lost = !result.checkpoints.empty() && result.checkpoints.back().on_signal &&
                    !result.checkpoints.back().error.empty();
  return lost ? 1 : 128 + (sig ? sig : SIGTERM);
}

int executeRun(const RunRequest& req, const RankPlace& place, RunSetup& s) {
  RunState r(req, place, s);
  connectPhase(r);
  if (auto code = resolveBatchPhase(r)) return *code;
  Trainer trainer(s.cfg, r.comm(), s.data, s.device, s.plan, &req.faults);
  if (s.cfg.batch.adapt != BatchAdapt::kOff) setUpAdaptive(r, trainer);
  r.console->line(strCat("model: ", trainer.model().describe(), ", precision ",
                         toString(s.cfg.train.precision),
                         s.cfg.model.sync_batchnorm ? ", synchronised BatchNorm" : ""));
  Checkpointer checkpointer(s.cfg.checkpoint, s.checkpoint_dir,
                            {s.plan, r.searched ? r.searched->chosen : 0, s.cfg.resolved,
                             configLevers(s.cfg)},
                            r.comm(),
                            &req.faults);
  trainer.setCheckpointer(&checkpointer);
  std::unique_ptr<StepProfiler> profiler;  // Note [step profiler]
  if (s.cfg.profile.on()) {
    profiler = std::make_unique<StepProfiler>(s.cfg.profile, (fs::path(req.output) / "profile").string(),
                                              r.comm().backendName(), place.rank, place.size,
                                              s.device.is_cuda());
    trainer.setProfiler(profiler.get());
  }
  MetricSinks sinks;
  attachMetricSinks(r, trainer, sinks);
  r.clock.lap("model");
  if (r.resumed) {
    restoreState(*r.resumed, trainer.state(), place.rank, place.size);
    trainer.resumeAt(positionOf(r.resumed->manifest));
    r.clock.lap("resume_read");
  }
  // Note [heartbeat]: the supervisor's figures of this attempt.
  heartbeat::setBatch(s.plan.per_gpu, s.plan.accum, s.plan.global);
  heartbeat::setStep(r.resumed ? r.resumed->manifest.step : 0);
  heartbeat::setCheckpoint(r.resumed ? r.resumed->manifest.step : -1);
  heartbeat::setPhase("train");
  const auto result = trainer.train(*r.console, [&req] { return req.stop_signal() != 0; });
  heartbeat::setPhase("finish");  // the report and the model: no steps, not a hang
  r.clock.lap("train");
  return finishPhase(r, trainer, result);
}

std::string planOutput(const RunRequest& req, int world, bool json) {
  const auto cfg = loadRunConfig(req);
  DataContext ctx;
  ctx.module_targets = trainsModuleLoss(cfg);  // Note [module loss]
  const auto info = describeData(cfg.data, cfg.train.seed, cfg.base_dir, ctx);
  world = std::max(1, world);
  if (cfg.batch.per_gpu_auto) {
    // Nothing to plan yet: the search picks the batch on the real hardware. The
    // global batch may be known already, and with it the tokens of a step (Note
    // [tokens per sample]): the JSON has the tokens keys a plan has (tokens_per_step
    // only with the global batch), the text its tokens line.
    const auto& sc = cfg.search;
    Plan known;
    known.global = std::max<int64_t>(0, cfg.batch.global);
    known.tokens_per_sample = tokensPerSample(cfg);
    known.global_tokens = cfg.batch.global_tokens;
    if (json) {
      nlohmann::ordered_json j{{"world_size", world}, {"per_gpu_batch", "auto"}};
      j.update(planTokensJson(known));
      j.update(nlohmann::ordered_json{{"dataset_size", info.train_size},
                                      {"search",
                                       {{"min", sc.min},
                                        {"max", sc.max},
                                        {"objective", toString(sc.objective)},
                                        {"tolerance", sc.tolerance}}}});
      return j.dump(2) + "\n";
    }
    if (known.global <= 0) known.tokens_per_sample = 0;  // no step to count the tokens of
    return strCat("plan: world ", world,
                  " x per-GPU batch auto: the batch search picks it at run time, measuring "
                  "candidates from search.min=",
                  sc.min, sc.max > 0 ? strCat(" to search.max=", sc.max) : std::string(),
                  " on every rank (objective ", toString(sc.objective), "); run `batchdist search ",
                  req.config_path, "` under mpirun to see it\n", planTokensText(known));
  }
  const auto plan = makePlan(cfg, world, info.train_size, modelHasBatchNorm(cfg.model, cfg.base_dir));
  return json ? planJson(plan).dump(2) + "\n" : planText(plan);
}

}  // namespace batchdist::worker
