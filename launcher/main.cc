// batchdist: main(). Parses the command line, opens the MPI scope, and turns
// every failure into one clear message and a non-zero exit of the whole job.

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>

#include "common/error.h"
#include "common/host.h"
#include "common/stdlib_guard.h"
#include "collective/process_group.h"
#include "collective/torch_compat.h"
#include "launcher/cli.h"
#include "launcher/elastic/supervisor.h"
#include "launcher/job.h"
#include "launcher/mpi_scope.h"
#include "launcher/slurm_script.h"
#include "worker/common/faults.h"
#include "worker/common/files.h"
#include "worker/config/config.h"
#include "worker/data/data.h"
#include "worker/data/measure.h"
#include "worker/model/model.h"
#include "worker/plan/plan.h"
#include "worker/run.h"
#include "worker/task/task.h"

namespace batchdist::launcher {
namespace {

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
    if (job.gpus_per_node > 0 && cfg.train.device == worker::DeviceKind::kCpu) {
      throw ConfigError(strCat(cfg.source, ": train.device: cpu, but --gpus-per-node ",
                               job.gpus_per_node, " asks Slurm for GPUs; pass --gpus-per-node 0 "
                               "--tasks-per-node T for a CPU job, or set train.device: auto"));
    }
    if (job.gpus_per_node == 0 && cfg.train.device == worker::DeviceKind::kCuda) {
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
        worker::DataContext ctx;
        ctx.module_targets = worker::trainsModuleLoss(cfg);  // Note [module loss]
        info = worker::describeData(cfg.data, cfg.train.seed, cfg.base_dir, ctx);
      } catch (const Error& e) {
        std::cout << "batchdist slurm: note: the data cannot be read here (" << e.what()
                  << "); the batch plan is checked when the job starts\n";
      }
      if (info) {
        try {
          worker::makePlan(cfg, world, info->train_size,
                           worker::modelHasBatchNorm(cfg.model, cfg.base_dir));
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
              << (job.launcher == "srun" ? "srun --mpi=pmix"
                  : job.elastic          ? "batchdist elastic, which runs mpirun"
                                         : "mpirun")
              << " ("
              << job.launcher_reason << ")\n";
    if (job.requeue) {
      std::cout << "  before the time limit (SIGUSR1 " << job.signal_before_s
                << " s ahead) the ranks checkpoint; unfinished, the job requeues itself and "
                   "resumes from "
                << job.output << "/<job id>/checkpoints (--resume auto; --no-requeue: stop only)\n";
    }
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
    std::cerr << strCat("[task ", procid ? procid : "?", " host ", hostName(), "] error: ", problem,
                        "\n")
              << std::flush;
  }
  return 2;
}

worker::RunRequest requestFrom(const CliOptions& cli) {
  RunOptions options;
  options.output = cli.output;
  options.resume = cli.resume;
  options.quiet = cli.quiet;
  options.research = cli.research;
  options.search_only = cli.verb == Verb::kSearch;
  options.report = cli.report;
  auto req = runRequest(cli.config, cli.sets, options);
  req.stop_signal = stopSignal;
  return req;
}

int runPlan(const CliOptions& cli) {
  try {
    std::cout << worker::planOutput(requestFrom(cli), cli.world, cli.json);
    return 0;
  } catch (const Error& e) {
    // The message may quote bytes from the user's file that are not UTF-8.
    if (cli.json) {
      std::cout << nlohmann::json{{"error", e.what()}}.dump(-1, ' ', false,
                                                            nlohmann::json::error_handler_t::replace)
                << "\n";
    }
    std::cerr << "batchdist: error: " << e.what() << std::endl;
    return e.exitCode();
  }
}

/// `train` and `search` (launcher/job.h: the library's run too).
int runTrain(const CliOptions& cli, MpiScope& mpi, const worker::FaultPlan& faults,
             double loaded_s, double mpi_ready_s) {
  auto req = requestFrom(cli);
  req.faults = faults;
  req.load_s = loaded_s;
  req.mpi_init_s = mpi_ready_s - loaded_s;
  return runTrainJob(std::move(req), mpi);
}

/// `data`: the input pipeline alone on every rank, no model, no rendezvous; rank 0
/// prints every rank's figures and the total.
int runData(const CliOptions& cli, MpiScope& mpi, const worker::FaultPlan& faults) {
  auto req = requestFrom(cli);
  if (cli.json) req.quiet = true;  // stdout is the JSON object alone
  const worker::RankPlace place = placeOf(mpi);
  worker::RunSetup setup;
  if (const int code = prepare(req, place, mpi, setup); code != 0) return code;
  worker::LoaderMeasurement mine;
  int64_t tokens_per_sample = 0;  // Note [tokens per sample]: the plan's
  const int code = mpi.agree([&] {
    auto plan = setup.plan;
    if (plan.steps_per_epoch == 0) {  // per_gpu: auto: a typical batch
      plan = worker::makePlan(setup.cfg, place.size, setup.data.train.size(), setup.has_bn,
                              std::min<int64_t>(64, std::max<int64_t>(2, setup.data.train.size() / place.size)));
    }
    mine = worker::measureLoader(setup.cfg, setup.data.train, plan, place.rank, cli.seconds,
                                 /*uint8_images=*/!cli.float_images, faults.slow_read_us);
    tokens_per_sample = plan.tokens_per_sample;
  });
  if (code != 0) return code;
  const auto all = mpi.gatherToRank0(mine.json().dump());
  if (place.rank == 0) {
    std::vector<worker::LoaderMeasurement> ranks;
    for (const auto& text : all) ranks.push_back(worker::LoaderMeasurement::fromJson(nlohmann::json::parse(text)));
    std::cout << worker::dataReport(ranks, setup.data, setup.cfg, cli.json, tokens_per_sample)
              << std::flush;
  }
  return 0;
}

/// Note [same command]: every rank runs the same verb of the same version, or
/// every rank exits 2 and rank 0 says which rank differs. Collective.
int checkSameCommand(const CliOptions& cli, MpiScope& mpi, const worker::FaultPlan& faults) {
  // Tests stand in for another build: BATCHDIST_FAULT_VERSION=V on some ranks.
  const auto problem = mpi.commandMismatch(
      toString(cli.verb), faults.version.empty() ? BATCHDIST_VERSION : faults.version);
  if (problem.empty()) return 0;
  if (mpi.rank() == 0) std::cerr << strCat(mpi.tag(), " error: ", problem, "\n") << std::flush;
  return 2;
}

/// `train`, `search` and `data` under MPI: the ranks agree on the command, then
/// run the verb. An MPI call that fails on MPI_COMM_WORLD (Note [mpi errors]) ends
/// the job with this rank's message, not with MPI's abort.
int runMpiVerb(const CliOptions& cli, MpiScope& mpi, const EnvLookup& env, double loaded_s,
               double mpi_ready_s) {
  try {
    if (const auto problem = srunWorldProblem(env, mpi.size()); !problem.empty()) {
      return srunProblem(problem);
    }
    // Note [fault plan]: read once, here; a bad value ends the job before anything starts.
    const auto faults = worker::faultPlanFromEnvironment(env);
    if (const int code = checkSameCommand(cli, mpi, faults); code != 0) return code;
    if (cli.verb == Verb::kData) return runData(cli, mpi, faults);
    return runTrain(cli, mpi, faults, loaded_s, mpi_ready_s);
  } catch (const Error& e) {
    std::cerr << strCat(mpi.tag(), " error: ", e.what(), "\n") << std::flush;
    abortJob(mpi, e.exitCode());
  }
}

}  // namespace
}  // namespace batchdist::launcher

int main(int argc, char** argv) {
  using namespace batchdist;
  ensureSystemStdlib();  // Note [libstdc++ first]: before anything else runs
  // Kineto (Note [step profiler]) prints its stages and "USDT ... profiler_start"
  // on stderr at every level below 6; batchdist says what it traced or why not.
  // Set before any thread starts; a user's own KINETO_LOG_LEVEL stands.
  setenv("KINETO_LOG_LEVEL", "6", /*overwrite=*/0);
  // Note [phases]: loading the binary and its libraries (LibTorch) before main().
  const double loaded_s = launcher::secondsSinceProcessStart();
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
  if (cli.verb == launcher::Verb::kPlan) return launcher::runPlan(cli);
  if (cli.verb == launcher::Verb::kSlurm) return launcher::runSlurm(cli);
  if (cli.verb == launcher::Verb::kElastic) return launcher::runElastic(cli);
  // srun without a process manager would start N singletons: say so before
  // MPI_Init (Open MPI aborts in it) and, for other MPIs, after it.
  const launcher::EnvLookup env = [](const char* name) { return std::getenv(name); };
  if (std::getenv("SLURM_STEP_ID") != nullptr) {
    const auto problem = launcher::srunLaunchProblem(env, launcher::mpiSlurmPmiSupport());
    if (!problem.empty()) return launcher::srunProblem(problem);
  }
  launcher::MpiScope mpi(&argc, &argv);
  const double mpi_ready_s = launcher::secondsSinceProcessStart();  // Note [phases]
  return launcher::runMpiVerb(cli, mpi, env, loaded_s, mpi_ready_s);
}
