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
#include "worker/run_decision.h"
#include "worker/run_report.h"
#include "worker/run_search.h"
#include "worker/join.h"
#include "worker/model/flops.h"
#include "worker/model/model.h"
#include "worker/model/precision.h"
#include "worker/report/metrics_log.h"
#include "worker/report/tensorboard.h"
#include "worker/search/cache.h"
#include "worker/search/output.h"
#include "worker/search/search.h"
#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/step/step_measurer.h"
#include "worker/train/step/memory.h"
#include "worker/train/trainer.h"
#include "worker/train/step/update_strategy.h"

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

/// The signal any rank received (all learn it; collective).
int agreedSignal(const RunRequest& req, collective::Communicator& comm) {
  return static_cast<int>(
      comm.allreduce(static_cast<double>(req.stop_signal()), collective::ReduceOp::kMax));
}

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
  // Note [loader]: auto threads are this rank's share of the host's cores.
  s.cfg.data.workers = resolveWorkers(s.cfg.data, usableCpus(), place.local_size);
  s.cfg.data.workers_auto = false;
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
  CacheEntry cache;
  RunDecision d;  ///< Note [run decisions]
  bool lead() const { return place.rank == 0; }
  collective::Communicator& comm() { return *conn.comm; }
};

/// The console's line for a sharded update (Note [sharded optimizer], Note
/// [sharded gradients]); "" when not sharded.
std::string updateLine(const DistConfig& dist, collective::Communicator& comm) {
  const int w = comm.size();
  const bool native = comm.nativeFlatCollectives();
  if (shardsParameters(dist, w)) {
    return strCat("update: dist.shard: parameters (ZeRO-3): each rank keeps 1/", w,
                  " of the parameters, of the summed gradient and of the optimizer state; each "
                  "unit's parameters all-gathered before its forward and again before its backward, ",
                  dist.reshard_after_forward ? "freed after each" : "kept from forward to backward "
                  "(dist.reshard_after_forward: false)",
                  dist.prefetch ? ", the next unit's gather started as a unit begins" : "",
                  "; its gradients reduce-scattered",
                  dist.overlap ? " as backward produces them" : " after backward (dist.overlap: false)",
                  native ? "" : " (emulated by an allreduce on gloo: 2x the bytes)");
  }
  if (shardsGradients(dist, w)) {
    return strCat("update: dist.shard: gradients (ZeRO-2): each micro-batch's gradients "
                  "reduce-scattered per ", dist.bucket_mb, " MB segment",
                  dist.overlap ? " as backward produces them" : " after backward (dist.overlap: false)",
                  native ? "" : " (emulated by an allreduce on gloo: 2x the bytes)",
                  ", each rank keeps 1/", w, " of the summed gradient and of the optimizer "
                  "state, one small allreduce of partial sums (clipping, fp16, LARS, noise "
                  "scale), then an all-gather");
  }
  if (dist.shard == Shard::kOptimizer || dist.shard == Shard::kGradients ||
      dist.shard == Shard::kParameters) {
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

/// The plan of the run's config on this world: the search's per-GPU batch when it chose one.
Plan planOf(const RunState& r) {
  return makePlan(r.d.cfg, r.place.size, r.s.data.train.size(), r.s.has_bn,
                  r.d.searched ? r.d.searched->chosen : 0);
}

/// The batch search (or its cache) and the plan it gives. Returns the exit code
/// when the run ends here: a stop signal during the search, or the `search` verb.
std::optional<int> searchPhase(RunState& r) {
  auto& s = r.s;
  const double search_t0 = monotonicSeconds();
  heartbeat::setPhase("search");  // Note [heartbeat]
  try {
    r.d.searched = searchBatch(r.req, s, r.d.cfg, r.comm(), *r.console, &r.cache);
    r.clock.lap("search");
    if (!r.d.searched->data_bound.empty()) r.console->line("search: " + r.d.searched->data_bound);
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
      finishStoppedSearch(r.req, r.place, s, r.d.cfg, r.comm(), e.lastPerGpu(),
                          monotonicSeconds() - search_t0, sig);
    }
    r.console->line(strCat("stop requested during the batch search: every rank stopped ", e.what(),
                           "; nothing was trained; wrote ", r.req.output, "/report.json"));
    r.comm().barrier();
    return 128 + (sig ? sig : SIGTERM);
  }
  if (r.lead()) {
    writeSearchArtifacts(r.req, *r.d.searched);
    if (s.cfg.report.tensorboard) {
      writeSearchEvents((fs::path(r.req.output) / "tensorboard" / "search").string(), *r.d.searched);
    }
  }
  // Note [lever search]: auto levers become the search's choice before anything is built.
  if (const Levers asked = configLevers(r.d.cfg); hasAutoLevers(asked)) {
    const Levers& chosen = r.d.searched->chosen_levers;
    r.d.cfg = decidedConfig(r.d.cfg, std::nullopt, chosen);
    r.console->line(strCat("levers: ", leversText(chosen), " (the search's choice for ",
                           autoLeversText(asked), ")"));
  }
  r.d.plan = planOf(r);  // the plan follows the choice
  if (r.req.search_only) {
    if (r.console->enabled()) std::cout << planText(r.d.plan) << std::flush;
    r.comm().barrier();
    r.clock.write(r.req, r.place, nullptr);
    return 0;
  }
  return std::nullopt;
}

/// A checkpoint to resume from, then the per-GPU batch: the config's, the
/// checkpoint's, or the search's (Note [run decisions]). Returns the exit code
/// when the run ends here.
std::optional<int> resolveBatchPhase(RunState& r) {
  r.d.resumed = decideResume(r.req, r.s, r.comm(), *r.console);
  if (!r.d.resumed && !r.s.plan_error.empty()) throw ConfigError(r.s.plan_error);
  r.d.cfg = r.d.resumed ? decidedConfig(r.s.cfg, r.d.resumed->batch, r.d.resumed->levers)
                        : r.s.cfg;
  r.clock.lap("resume_plan");
  if (r.req.search_only || r.d.cfg.batch.per_gpu_auto) {
    if (auto code = searchPhase(r)) return code;
  } else {
    r.d.plan = planOf(r);
    const int64_t m = r.d.resumed ? r.d.resumed->checkpoint.manifest.searched_per_gpu : 0;
    if (m > 0 && m == r.d.plan.per_gpu) {
      r.d.searched.emplace();  // the search result the checkpoint's run found for this world size
      r.d.searched->chosen = m;
      r.d.searched->cached = true;
    }
  }
  if (r.console->enabled()) std::cout << planText(r.d.plan) << std::flush;
  return std::nullopt;
}

/// Note [adaptive training]: the search's samples/s per per-GPU batch (a resume
/// on the same world size takes back its checkpoint's table instead).
void setUpAdaptive(RunState& r, Trainer& trainer) {
  const auto& cfg = r.d.cfg;
  const auto& plan = r.d.plan;
  auto space = adaptSpace(cfg, plan, r.s.has_bn);
  if (r.d.searched) {
    const auto table = adaptThroughput(*r.d.searched);
    space.throughput.insert(space.throughput.end(), table.begin(), table.end());
  }
  trainer.setAdaptive(space);
  const int64_t tokens = plan.tokens_per_sample;  // Note [tokens per sample]
  const bool warmup = cfg.batch.adapt == BatchAdapt::kWarmup;  // Note [batch-size warmup]
  r.console->line(strCat("adapt: batch.adapt: ", toString(cfg.batch.adapt), ": global batch from ",
                         space.g0, " up to ", space.ceiling,
                         tokens > 0 ? strCat(" (", space.g0 * tokens, " .. ", space.ceiling * tokens,
                                             " tokens)")
                                    : std::string(),
                         warmup ? ", doubled as B_simple reaches G0 x 2^k" : "",
                         ", re-decided every ", cfg.batch.adapt_every_steps,
                         " steps and at epoch ends",
                         plan.warmup_steps <= 0 ? std::string()
                         : cfg.batch.adapt_in_warmup
                             ? strCat(" (in the warmup's ", plan.warmup_steps,
                                      " steps too: batch.adapt_in_warmup)")
                             : strCat(" once the warmup's ", plan.warmup_steps, " steps are done"),
                         "; the run ends at ", plan.total_steps, " G0-equivalent steps",
                         cfg.batch.adapt_gain == AdaptGain::kLinear
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
  const int64_t resumed_step = r.d.resumed ? r.d.resumed->checkpoint.manifest.step : -1;
  sinks.log.emplace((fs::path(r.req.output) / "metrics.jsonl").string(), resumed_step);
  if (r.d.cfg.report.tensorboard) {
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
  {
    const WholeParameters whole(trainer.model());  // Note [parameter units]: model.pt is whole
    if (r.lead()) {
      finishRun(r.req, r.place, r.s, r.d, r.comm(), trainer, result, sig, *r.console);
      markCache(r.cache, result);
    }
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

/// Note [mfu]: the run's yardstick, on every rank alike (a CPU's measured peak:
/// the mean of every rank's, measured at once).
Yardstick runYardstick(const Config& cfg, const Model& model, const at::Device& device,
                       collective::Communicator& comm) {
  const bool cuda = device.is_cuda();
  Yardstick y = yardstickFor(model.trainingFlopsPerSample(), cfg.train, cuda,
                             cuda ? compat::cudaDeviceName(device.index()) : "", comm.size(),
                             convolutional(cfg.model));
  if (!cuda && cfg.train.peak_tflops <= 0 && y.flops_per_sample > 0) {
    y.peak_flops = comm.allreduce(y.peak_flops, collective::ReduceOp::kSum) / comm.size();
  }
  return y;
}

int executeRun(const RunRequest& req, const RankPlace& place, RunSetup& s) {
  RunState r(req, place, s);
  connectPhase(r);
  if (auto code = resolveBatchPhase(r)) return *code;
  const Config& cfg = r.d.cfg;  // Note [run decisions]: decided; nothing below edits it
  const Plan& plan = r.d.plan;
  if (const auto line = tuneConvolutionsForTraining(cfg, s.device); !line.empty()) {
    r.console->line(line);
  }
  Trainer trainer(cfg, r.comm(), s.data, s.device, plan, &req.faults);
  if (cfg.batch.adapt != BatchAdapt::kOff) setUpAdaptive(r, trainer);
  trainer.setYardstick(runYardstick(cfg, trainer.model(), s.device, r.comm()));
  r.console->line(strCat("model: ", trainer.model().describe(), ", precision ",
                         toString(cfg.train.precision),
                         cfg.model.sync_batchnorm ? ", synchronised BatchNorm" : "", ", optimizer step ",
                         toString(trainer.engine().update().optimizer().kernels())));
  r.console->line(yardstickLine(trainer.yardstick()));
  Checkpointer checkpointer(cfg.checkpoint, s.checkpoint_dir,
                            {plan, r.d.searched ? r.d.searched->chosen : 0, cfg.resolved,
                             configLevers(cfg)},
                            r.comm(), &req.faults);
  trainer.setCheckpointer(&checkpointer);
  std::unique_ptr<StepProfiler> profiler;  // Note [step profiler]
  if (cfg.profile.on()) {
    profiler = std::make_unique<StepProfiler>(cfg.profile, (fs::path(req.output) / "profile").string(),
                                              r.comm().backendName(), place.rank, place.size,
                                              s.device.is_cuda());
    trainer.setProfiler(profiler.get());
  }
  MetricSinks sinks;
  attachMetricSinks(r, trainer, sinks);
  r.clock.lap("model");
  const CheckpointCheck* resumed = r.d.resumed ? &r.d.resumed->checkpoint : nullptr;
  if (resumed) {
    restoreState(*resumed, trainer.state(), place.rank, place.size);
    trainer.resumeAt(positionOf(resumed->manifest));
    r.clock.lap("resume_read");
  }
  // Note [heartbeat]: the supervisor's figures of this attempt.
  heartbeat::setBatch(plan.per_gpu, plan.accum, plan.global);
  heartbeat::setStep(resumed ? resumed->manifest.step : 0);
  heartbeat::setCheckpoint(resumed ? resumed->manifest.step : -1);
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
