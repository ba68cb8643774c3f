// batchdist: main(). Parses the command line, opens the MPI scope, and turns
// every failure into one clear message and a non-zero exit of the whole job.

#include <sched.h>
#include <torch/torch.h>
#include <unistd.h>

#include <sys/stat.h>

#include <atomic>
#include <csignal>
#include <cstring>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "collective/error.h"
#include "collective/process_group.h"
#include "collective/rendezvous.h"
#include "collective/torch_compat.h"
#include "launcher/cli.h"
#include "launcher/device.h"
#include "launcher/mpi_scope.h"
#include "launcher/slurm_script.h"
#include "worker/config.h"
#include "worker/data.h"
#include "worker/json.h"
#include "worker/model.h"
#include "worker/plan.h"
#include "worker/precision.h"
#include "worker/report.h"
#include "worker/search.h"
#include "worker/trainer.h"

namespace batchdist::launcher {
namespace {

// SIGTERM (Slurm's time limit, scancel, preemption), SIGUSR1 (sbatch
// --signal=USR1@T) and SIGINT ask for a clean stop: every rank finishes the same
// step, rank 0 writes the model and the report, and the job exits 128 + signal.
// A second signal of the same kind acts as usual (SA_RESETHAND).
std::atomic<int> g_stop_signal{0};

extern "C" void onStopSignal(int sig) { g_stop_signal.store(sig); }

/// CPUs this process may run on (its affinity mask: cgroups, taskset, Slurm's
/// --cpus-per-task), not the machine's core count.
int usableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

void installStopHandlers() {
  struct sigaction sa {};
  sa.sa_handler = onStopSignal;
  sa.sa_flags = SA_RESETHAND | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGUSR1, SIGINT}) sigaction(sig, &sa, nullptr);
}

std::string dirOf(const std::string& path) {
  const auto p = std::filesystem::path(path).parent_path();
  return p.empty() ? "." : p.string();
}

/// `batchdist slurm`: checks the config for the job's world size, writes the
/// sbatch script and, with --submit, submits it.
int runSlurm(const CliOptions& cli) {
  namespace fs = std::filesystem;
  try {
    // A bad config fails here, not after a wait in the queue.
    const auto cfg = worker::loadConfig(cli.config, cli.sets);
    SlurmJobSpec job = cli.slurm;
    job.config = fs::absolute(cli.config).lexically_normal().string();
    job.sets = cli.sets;
    job.output = fs::absolute(cli.output).lexically_normal().string();
    job.workdir = fs::current_path().string();
    job.binary = fs::read_symlink("/proc/self/exe").string();
    if (!job.script.empty()) job.script = fs::absolute(job.script).lexically_normal().string();
    completeSlurmJob(job);
    const int world = job.nodes * job.tasks_per_node;
    if (job.gpus_per_node > 0 && cfg.train.device == "cpu") {
      throw ConfigError(strCat(cfg.source, ": train.device: cpu, but --gpus-per-node ",
                               job.gpus_per_node, " asks Slurm for GPUs; pass --gpus-per-node 0 "
                               "--tasks-per-node T for a CPU job, or set train.device: auto"));
    }
    if (job.gpus_per_node == 0 && cfg.train.device == "cuda") {
      throw ConfigError(strCat(cfg.source, ": train.device: cuda, but --gpus-per-node 0 is a CPU "
                               "job; pass --gpus-per-node G"));
    }
    if (!job.interface.empty() && !cfg.dist.interface.empty() &&
        cfg.dist.interface != job.interface) {
      throw ConfigError(strCat(cfg.source, ": dist.interface: ", cfg.dist.interface,
                               " wins over --interface ", job.interface, "; drop one of them"));
    }
    // The batch arithmetic must work for this world size (data permitting: it may
    // live only on the compute nodes).
    if (!cfg.batch.per_gpu_auto) {
      std::optional<worker::DataInfo> info;
      try {
        info = worker::describeData(cfg.data, cfg.train.seed, dirOf(cli.config));
      } catch (const Error& e) {
        std::cout << "batchdist slurm: note: the data cannot be read here (" << e.what()
                  << "); the batch plan is checked when the job starts\n";
      }
      if (info) {
        try {
          worker::makePlan(cfg, world, info->train_size, worker::modelHasBatchNorm(cfg.model));
        } catch (const ConfigError& e) {
          throw ConfigError(strCat("a job of ", job.nodes, " node(s) x ", job.tasks_per_node,
                                   " rank(s) is world size ", world, ": ", e.what()));
        }
      }
    }
    resolveLauncher(job, job.launcher == "mpirun" ? std::string() : probeSrunMpiList());
    fs::create_directories(job.output);
    fs::create_directories(fs::path(job.script).parent_path());
    worker::writeFileAtomic(job.script, slurmScript(job));
    chmod(job.script.c_str(), 0755);
    std::cout << "batchdist slurm: wrote " << job.script << "\n  " << job.nodes << " node(s) x "
              << job.tasks_per_node << (job.gpus_per_node > 0 ? " GPU" : " CPU")
              << " rank(s) = world size " << world << "; ranks started by "
              << (job.launcher == "srun" ? "srun --mpi=pmix" : "mpirun") << " ("
              << job.launcher_reason << ")\n";
    if (!job.submit) {
      std::cout << "  submit with: sbatch " << job.script << "\n";
      return 0;
    }
    const std::string id = submitSlurmScript(job.script);
    std::cout << "batchdist slurm: submitted batch job " << id << "\n  log " << job.output << "/"
              << job.job_name << "-" << id << ".out, report " << job.output << "/" << id
              << "/report.json\n";
    return 0;
  } catch (const Error& e) {
    std::cerr << "batchdist: error: " << e.what() << std::endl;
    return e.exitCode();
  } catch (const std::exception& e) {  // the file system: no room, no permission
    std::cerr << "batchdist: error: " << e.what() << std::endl;
    return 1;
  }
}

/// A problem with how srun started this task: every task exits 2, task 0 says why.
int srunProblem(const std::string& problem) {
  const char* procid = std::getenv("SLURM_PROCID");
  if (procid == nullptr || std::string(procid) == "0") {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    std::cerr << strCat("[task ", procid ? procid : "?", " host ", host, "] error: ", problem, "\n")
              << std::flush;
  }
  return 2;
}

int runPlan(const CliOptions& cli) {
  try {
    const auto cfg = worker::loadConfig(cli.config, cli.sets);
    const auto info = worker::describeData(cfg.data, cfg.train.seed, dirOf(cli.config));
    if (cfg.batch.per_gpu_auto) {
      // Nothing to plan yet: the search picks the batch on the real hardware.
      const auto& sc = cfg.search;
      if (cli.json) {
        std::cout << worker::json::Object()
                         .add("world_size", std::max(1, cli.world))
                         .add("per_gpu_batch", "auto")
                         .add("dataset_size", info.train_size)
                         .raw("search", worker::json::Object()
                                            .add("min", sc.min)
                                            .add("max", sc.max)
                                            .add("objective", sc.objective)
                                            .add("tolerance", sc.tolerance)
                                            .str())
                         .str()
                  << "\n";
      } else {
        std::cout << "plan: world " << std::max(1, cli.world)
                  << " x per-GPU batch auto: the batch search picks it at run time, measuring "
                     "candidates from search.min="
                  << sc.min << (sc.max > 0 ? strCat(" to search.max=", sc.max) : std::string())
                  << " on every rank (objective " << sc.objective
                  << "); run `batchdist search " << cli.config << "` under mpirun to see it\n";
      }
      return 0;
    }
    const auto plan = worker::makePlan(cfg, std::max(1, cli.world), info.train_size,
                                       worker::modelHasBatchNorm(cfg.model, dirOf(cli.config)));
    std::cout << (cli.json ? worker::planJson(plan) + "\n" : worker::planText(plan));
    return 0;
  } catch (const Error& e) {
    if (cli.json) std::cout << worker::json::Object().add("error", e.what()).str() << "\n";
    std::cerr << "batchdist: error: " << e.what() << std::endl;
    return e.exitCode();
  }
}

/// Every rank must train the same thing: compares each rank's resolved config
/// with rank 0's. Keys that may differ per rank (its memory budget, interface,
/// threads, cache file) are skipped. Collective; throws ConfigError on every rank.
void checkConfigsAgree(const worker::Config& cfg, collective::Communicator& comm) {
  static const char* kPerRank[] = {"search.memory_limit_mb", "dist.interface", "train.threads",
                                   "search.cache"};
  std::string mine;
  for (const auto& [path, value] : cfg.resolved) {
    if (std::find(std::begin(kPerRank), std::end(kPerRank), path) == std::end(kPerRank)) {
      mine += path + "=" + value + "\n";
    }
  }
  const std::string root = comm.broadcast(mine, 0);
  std::string diff;
  if (root != mine) {
    std::istringstream a(mine), b(root);
    for (std::string x, y; std::getline(a, x) && std::getline(b, y);) {
      if (x != y) {
        diff += (diff.empty() ? "" : "; ") + x.substr(0, x.find('=')) + " = " +
                x.substr(x.find('=') + 1) + " here, " + y.substr(y.find('=') + 1) + " on rank 0";
      }
    }
  }
  if (comm.any(!diff.empty())) {
    throw ConfigError(diff.empty() ? std::string("another rank's config differs from rank 0's "
                                                 "(see its message)")
                                   : "config differs from rank 0's: " + diff +
                                         ". Every rank must train the same model on the same "
                                         "data; launch them with the same file and --set options");
  }
}

/// Runs (or reads from the cache) the coordinated batch search. Collective.
worker::SearchResult searchBatch(const CliOptions& cli, const worker::Config& cfg,
                                 collective::Communicator& comm, const worker::DataSplit& data,
                                 at::Device device, worker::Console& console) {
  namespace fs = std::filesystem;
  const bool lead = comm.rank() == 0;
  const bool bn = worker::modelHasBatchNorm(cfg.model, dirOf(cli.config));
  worker::SearchResult result;
  {
    auto measurer = worker::makeTrainStepMeasurer(cfg, comm, data, device, dirOf(cli.config));
    const auto budgets = comm.allgather(measurer->memoryBudgetMb());
    const worker::DataInfo info{data.train.size(), data.val.size(), data.train.sample_shape,
                                data.train.classes};
    const auto key =
        worker::searchCacheKey(cfg, info, comm.size(), measurer->deviceName(), budgets);
    const std::string cache_path = cfg.search.cache.empty()
                                       ? (fs::path(cli.output) / "search_cache.json").string()
                                       : cfg.search.cache;
    // Rank 0 reads the cache and tells the others what it found.
    std::optional<worker::SearchResult> cached;
    if (lead && !cli.research) cached = worker::readSearchCache(cache_path, key);
    const auto hit = comm.broadcast(
        cached ? strCat(cached->chosen, " ", cached->chosen_accum) : std::string(), 0);
    if (!hit.empty()) {
      if (cached) {
        result = *cached;
      } else {
        std::istringstream(hit) >> result.chosen >> result.chosen_accum;
        result.cached = true;
      }
      console.line(strCat("batch search: cached result for this model, data, device and world "
                          "size in ", cache_path, " (--research to measure again)"));
    } else {
      worker::BatchSearch search(cfg, comm, *measurer, data.train.size(), bn);
      result = search.run(&console);
      if (lead) worker::writeSearchCache(cache_path, key, result);
    }
  }
  if (lead) {
    worker::writeFileAtomic((fs::path(cli.output) / "search.json").string(),
                            worker::searchJson(result) + "\n");
    worker::writeFileAtomic((fs::path(cli.output) / "search.svg").string(),
                            worker::searchSvg(result));
    if (!cli.quiet) std::cout << worker::searchTable(result) << std::flush;
  }
  return result;
}

int runTrain(const CliOptions& cli, MpiScope& mpi) {
  const bool lead = mpi.rank() == 0;
  // From the start, so that a signal during set-up or the batch search is not
  // fatal: it is honoured at the first training step (rank 0 still writes the
  // report and the model).
  installStopHandlers();
  worker::Config cfg;
  worker::DataSplit data;
  worker::Plan plan;
  bool has_bn = false;
  at::Device device = at::kCPU;
  // Local, deterministic set-up: every rank fails the same way, so they agree and
  // exit together without an abort.
  const int code = mpi.agree([&] {
    cfg = worker::loadConfig(cli.config, cli.sets);
    device = chooseDevice(cfg, probeGpus(mpi.host()), mpi.host(), mpi.localRank(),
                          mpi.localSize());
    collective::resolveBackend(cfg.dist.backend, device);  // refused here, before any rendezvous
    worker::checkPrecision(cfg.train.precision, device);
    data = worker::loadData(cfg.data, cfg.train.seed, dirOf(cli.config));
    has_bn = worker::modelHasBatchNorm(cfg.model, dirOf(cli.config));
    if (cli.verb == "train" && !cfg.batch.per_gpu_auto) {
      plan = worker::makePlan(cfg, mpi.size(), data.train.size(), has_bn);
    }
  });
  if (code != 0) return code;

  try {
    const int threads = cfg.train.threads > 0
                            ? static_cast<int>(cfg.train.threads)
                            : std::max(1, usableCpus() /
                                              mpi.localSize());
    torch::set_num_threads(threads);
    if (device.is_cuda()) compat::setCudaDevice(device.index());

    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.dist.timeout_s * 1000));
    collective::RendezvousOptions ro;
    ro.interface = cfg.dist.interface;
    ro.timeout = timeout;
    ro.all_ranks_local = mpi.hostCount() == 1;
    const auto rv = collective::rendezvousOverMpi(MPI_COMM_WORLD, ro);
    collective::BackendOptions bo;
    bo.backend = cfg.dist.backend;
    bo.device = device;
    bo.timeout = timeout;
    bo.interface = rv.interface;
    bo.address = rv.address;
    auto comm = collective::createCommunicator(rv.store, mpi.rank(), mpi.size(), bo);
    checkConfigsAgree(cfg, *comm);

    worker::Console console(lead && !cli.quiet, isatty(STDOUT_FILENO) != 0);
    console.line(strCat("batchdist ", BATCHDIST_VERSION, ": ", mpi.size(), " rank(s) on ",
                        mpi.hostCount(), " host(s), backend ", comm->backendName(), ", device ",
                        device.str(), ", torch ", compat::torchVersion(), ", ", threads,
                        " thread(s)/rank, store ", rv.store_address));
    console.line(strCat("data: ", data.origin, " -> ", data.train.size(), " train / ",
                        data.val.size(), " validation samples"));
    std::optional<worker::SearchResult> searched;
    if (cli.verb == "search" || cfg.batch.per_gpu_auto) {
      searched = searchBatch(cli, cfg, *comm, data, device, console);
      // The plan (shards, lr scaling, warmup, BatchNorm minimum) follows the choice.
      plan = worker::makePlan(cfg, mpi.size(), data.train.size(), has_bn, searched->chosen);
      if (cli.verb == "search") {
        if (console.enabled()) std::cout << worker::planText(plan) << std::flush;
        comm->barrier();
        return 0;
      }
    }
    if (console.enabled()) std::cout << worker::planText(plan) << std::flush;

    worker::Trainer trainer(cfg, *comm, data, device, plan, dirOf(cli.config));
    console.line(strCat("model: ", trainer.model().describe(), ", precision ", cfg.train.precision,
                        cfg.model.sync_batchnorm ? ", synchronised BatchNorm" : ""));
    const auto result = trainer.train(console, [] { return g_stop_signal.load() != 0; });
    // The signal may have reached only some ranks; all learn which (once per run).
    const int own_sig = g_stop_signal.load();
    const int sig = static_cast<int>(comm->allreduce(static_cast<double>(own_sig),
                                                     collective::ReduceOp::kMax));
    if (!result.completed && own_sig != 0) {
      std::cerr << strCat(mpi.tag(), " received SIG", sigabbrev_np(own_sig),
                          ": stopped cleanly after step ", result.steps,
                          "; rank 0 saves the model and the report\n")
                << std::flush;
    }

    if (lead) {
      namespace fs = std::filesystem;
      fs::create_directories(cli.output);
      const std::string model_path = (fs::path(cli.output) / "model.pt").string();
      trainer.model().save(model_path + ".tmp");
      fs::rename(model_path + ".tmp", model_path);
      worker::RunInfo info;
      info.world_size = mpi.size();
      info.backend = comm->backendName();
      info.device = device.str();
      info.torch_version = compat::torchVersion();
      info.data_origin = data.origin;
      info.extra_json = strCat("\"hosts\": ", mpi.hostCount(), ", \"model_path\": ",
                               worker::json::quote(model_path), ", \"completed\": ",
                               result.completed ? "true" : "false");
      if (!result.completed) {
        info.extra_json += strCat(", \"stopped_by\": ",
                                  worker::json::quote(strCat("SIG", sigabbrev_np(sig ? sig : SIGTERM))));
      }
      const double step_time = result.time.total();
      info.extra_json += strCat(
          ", \"precision\": ", worker::json::quote(cfg.train.precision),
          ", \"time_breakdown\": ",
          worker::json::Object()
              .add("data_wait_s", result.time.data_wait)
              .add("compute_s", result.time.compute)
              .add("comm_s", result.time.comm)
              .add("data_wait_fraction", step_time > 0 ? result.time.data_wait / step_time : 0.0)
              .add("compute_fraction", step_time > 0 ? result.time.compute / step_time : 0.0)
              .add("comm_fraction", step_time > 0 ? result.time.comm / step_time : 0.0)
              .str(),
          ", \"memory\": ",
          worker::json::Object()
              .add("peak_mb", result.peak_memory_mb)
              .add("total_mb", result.memory_total_mb)
              .add("gpu_utilization", result.gpu_utilization)
              .str());
      if (cfg.train.precision == "fp16") {
        info.extra_json += strCat(", \"loss_scaler\": ",
                                  worker::json::Object()
                                      .add("scale", result.loss_scale)
                                      .add("skipped_steps", result.skipped_steps)
                                      .str());
      }
      if (searched) {
        info.extra_json += strCat(", \"search\": ",
                                  worker::json::Object()
                                      .add("chosen", searched->chosen)
                                      .add("cached", searched->cached)
                                      .add("candidates", static_cast<int64_t>(searched->candidates.size()))
                                      .add("timed_steps", searched->timed_steps)
                                      .add("seconds", searched->seconds)
                                      .str());
      }
      const auto report = worker::runReport(cfg, plan, result, info);
      worker::writeFileAtomic((fs::path(cli.output) / "report.json").string(), report);
      if (!cli.report.empty()) worker::writeFileAtomic(cli.report, report);
      const auto findings = worker::diagnose(
          cfg, result, device, device.is_cuda() ? compat::cudaDeviceName(device.index()) : "cpu");
      const double tt = std::max(1e-9, result.time.total());
      console.line(strCat("time: data wait ", worker::formatFixed(100 * result.time.data_wait / tt, 1),
                          " %, compute ", worker::formatFixed(100 * result.time.compute / tt, 1),
                          " %, communication ", worker::formatFixed(100 * result.time.comm / tt, 1),
                          " % of step time (rank 0)"));
      for (const auto& f : findings) console.line("diagnosis: " + f);
      console.line(strCat(result.completed ? "done: " : "stopped early: ", result.steps,
                          " steps, eval accuracy ",
                          worker::formatFixed(100.0 * result.eval_accuracy, 2), " %, ",
                          static_cast<int64_t>(result.samples_per_s), " samples/s, ",
                          worker::formatDuration(result.wall_s), "; wrote ", cli.output,
                          "/report.json and model.pt"));
    }
    comm->barrier();
    if (!result.completed) return 128 + (sig ? sig : SIGTERM);
  } catch (const Error& e) {
    // One write per message: the ranks' lines do not interleave under mpirun.
    std::cerr << strCat(mpi.tag(), " error: ", e.what(), "\n") << std::flush;
    mpi.abort(e.exitCode());
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::cerr << strCat(mpi.tag(), " error: ", what.substr(0, what.find("\nException raised from")),
                        "\n")
              << std::flush;
    mpi.abort(1);
  }
  return 0;
}

}  // namespace
}  // namespace batchdist::launcher

int main(int argc, char** argv) {
  using namespace batchdist;
  launcher::CliOptions cli;
  try {
    cli = launcher::parseCli(argc, argv);
  } catch (const Error& e) {
    std::cerr << "batchdist: error: " << e.what() << std::endl;
    return e.exitCode();
  }
  if (cli.help) {
    std::cout << launcher::usage();
    return 0;
  }
  if (cli.version) {
    std::cout << "batchdist " << BATCHDIST_VERSION << " (" << compat::buildDescription()
              << ", backends:";
    for (const auto& b : collective::availableBackends()) std::cout << " " << b;
    std::cout << ")\n";
    return 0;
  }
  if (cli.verb == "plan") return launcher::runPlan(cli);
  if (cli.verb == "slurm") return launcher::runSlurm(cli);
  // srun without a process manager would start N singletons: say so before
  // MPI_Init (Open MPI aborts in it) and, for other MPIs, after it.
  const launcher::EnvLookup env = [](const char* name) { return std::getenv(name); };
  if (std::getenv("SLURM_STEP_ID") != nullptr) {
    const auto problem = launcher::srunLaunchProblem(env, launcher::mpiSlurmPmiSupport());
    if (!problem.empty()) return launcher::srunProblem(problem);
  }
  launcher::MpiScope mpi(&argc, &argv);
  if (const auto problem = launcher::srunWorldProblem(env, mpi.size()); !problem.empty()) {
    return launcher::srunProblem(problem);
  }
  return launcher::runTrain(cli, mpi);
}
