#include "launcher/slurm_script.h"

#include <dlfcn.h>
#include <sys/wait.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>
#include <utility>

#include "common/error.h"

namespace batchdist::launcher {

namespace {

bool isWhole(const std::string& s, int* out) {
  if (s.empty() || s.size() > 6) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  *out = std::atoi(s.c_str());
  return true;
}

std::string timeError(const std::string& text, const std::string& why) {
  return strCat("--time '", text, "': ", why,
                "; Slurm's forms are MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS, "
                "DAYS-HOURS:MINUTES or DAYS-HOURS:MINUTES:SECONDS (e.g. --time 2:00:00)");
}

std::string stemOf(const std::string& path) {
  std::string stem = std::filesystem::path(path).stem().string();
  std::string out;
  for (char c : stem) {
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c
                                                                                                : '_';
  }
  return out.empty() ? "job" : out;
}

bool hasSpaceOrPercent(const std::string& s) {
  for (char c : s) {
    if (std::isspace(static_cast<unsigned char>(c)) || c == '%') return true;
  }
  return false;
}

const char* get(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

int envInt(const EnvLookup& env, const char* name) {
  const char* v = get(env, name);
  return v ? std::atoi(v) : 0;
}

/// "task P of a N-task srun step (SLURM_MPI_TYPE=T)".
std::string stepDescription(const EnvLookup& env) {
  const char* type = get(env, "SLURM_MPI_TYPE");
  const char* procid = get(env, "SLURM_PROCID");
  return strCat("task ", procid ? procid : "?", " of a ", envInt(env, "SLURM_STEP_NUM_TASKS"),
                "-task srun step (SLURM_MPI_TYPE=", type ? type : "unset", ")");
}

const char* kSrunFix =
    "Start the ranks with `srun --mpi=pmix` (`srun --mpi=list` shows what this Slurm offers) "
    "or with mpirun inside the allocation; "
    "`batchdist slurm CONFIG --nodes N --gpus-per-node G` writes a script that does";

}  // namespace

int64_t parseSlurmTime(const std::string& text) {
  if (text.empty()) throw ConfigError(timeError(text, "empty"));
  std::string rest = text;
  int days = -1;
  const auto dash = rest.find('-');
  if (dash != std::string::npos) {
    if (!isWhole(rest.substr(0, dash), &days)) throw ConfigError(timeError(text, "bad day count"));
    rest = rest.substr(dash + 1);
  }
  std::vector<int> parts;
  std::stringstream ss(rest);
  for (std::string item; std::getline(ss, item, ':');) {
    int v = 0;
    if (!isWhole(item, &v)) throw ConfigError(timeError(text, "not a Slurm time limit"));
    parts.push_back(v);
  }
  if (!rest.empty() && rest.back() == ':') throw ConfigError(timeError(text, "trailing ':'"));
  int64_t seconds = 0;
  if (days >= 0) {
    // D-H, D-H:M, D-H:M:S
    if (parts.empty() || parts.size() > 3) throw ConfigError(timeError(text, "not a Slurm time limit"));
    const int64_t h = parts[0], m = parts.size() > 1 ? parts[1] : 0, s = parts.size() > 2 ? parts[2] : 0;
    seconds = ((days * 24 + h) * 60 + m) * 60 + s;
  } else if (parts.size() == 1) {
    seconds = int64_t{parts[0]} * 60;  // M
  } else if (parts.size() == 2) {
    seconds = int64_t{parts[0]} * 60 + parts[1];  // M:S
  } else if (parts.size() == 3) {
    seconds = (int64_t{parts[0]} * 60 + parts[1]) * 60 + parts[2];  // H:M:S
  } else {
    throw ConfigError(timeError(text, "not a Slurm time limit"));
  }
  if (seconds <= 0) throw ConfigError(timeError(text, "the limit must be longer than 0"));
  return seconds;
}

int defaultSignalLead(int64_t limit_s) {
  if (limit_s <= 0) return 120;
  return static_cast<int>(std::min<int64_t>(120, std::max<int64_t>(1, limit_s / 4)));
}

void completeSlurmJob(SlurmJobSpec& job) {
  if (job.nodes < 1) throw ConfigError(strCat("--nodes must be >= 1, got ", job.nodes));
  if (job.gpus_per_node < 0) {
    throw ConfigError(
        "batchdist slurm needs --gpus-per-node G: the GPUs each node gives the job (one rank per "
        "GPU), or 0 for a CPU job with --tasks-per-node T ranks per node");
  }
  if (job.gpus_per_node > 0) {
    if (job.tasks_per_node != 0 && job.tasks_per_node != job.gpus_per_node) {
      throw ConfigError(strCat("--tasks-per-node ", job.tasks_per_node, " with --gpus-per-node ",
                               job.gpus_per_node, ": batchdist runs one rank per GPU, so a GPU "
                               "job has as many tasks per node as GPUs; drop --tasks-per-node"));
    }
    job.tasks_per_node = job.gpus_per_node;
  } else {
    if (job.tasks_per_node == 0) {
      throw ConfigError("--gpus-per-node 0 is a CPU job: say how many ranks each node runs with "
                        "--tasks-per-node T (e.g. one per socket, or 2 for the quickstart)");
    }
    if (job.tasks_per_node < 0) {
      throw ConfigError(strCat("--tasks-per-node must be >= 1, got ", job.tasks_per_node));
    }
  }
  if (job.cpus_per_task < 0) {
    throw ConfigError(strCat("--cpus-per-task must be >= 1, got ", job.cpus_per_task));
  }
  int64_t limit = 0;
  if (!job.time.empty()) limit = parseSlurmTime(job.time);
  if (job.signal_before_s < 0) {
    job.signal_before_s = defaultSignalLead(limit);
  } else if (job.signal_before_s == 0 || job.signal_before_s > 65535) {
    throw ConfigError(strCat("--signal-before ", job.signal_before_s,
                             ": Slurm takes 1 to 65535 seconds before the time limit"));
  } else if (limit > 0 && job.signal_before_s >= limit) {
    throw ConfigError(strCat("--signal-before ", job.signal_before_s, " s is not shorter than "
                             "--time ", job.time, " (", limit, " s): the stop signal would come "
                             "before training starts; pass a smaller --signal-before"));
  }
  if (job.launcher != "auto" && job.launcher != "srun" && job.launcher != "mpirun") {
    throw ConfigError(strCat("--launcher '", job.launcher, "': use auto, srun or mpirun"));
  }
  if (job.job_name.empty()) job.job_name = "batchdist-" + stemOf(job.config);
  for (char c : job.job_name) {
    if (std::isspace(static_cast<unsigned char>(c)) || c == '%' || c == '\'' || c == '"') {
      throw ConfigError(strCat("--job-name '", job.job_name,
                               "': no spaces, quotes or '%' in a Slurm job name"));
    }
  }
  for (const auto* path : {&job.output, &job.workdir}) {
    if (hasSpaceOrPercent(*path)) {
      throw ConfigError(strCat("'", *path, "': sbatch directives cannot hold a path with spaces "
                               "or '%'; pick an --output directory (and a working directory) "
                               "without them"));
    }
  }
  for (char c : job.interface) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
          c == ':')) {
      throw ConfigError(strCat("--interface '", job.interface,
                               "': not a network interface name (e.g. eth0, ib0)"));
    }
  }
  if (job.script.empty()) {
    job.script = (std::filesystem::path(job.output) / (job.job_name + ".sbatch")).string();
  }
}

void resolveLauncher(SlurmJobSpec& job, const std::string& srun_mpi_list) {
  const bool has_pmix = std::regex_search(srun_mpi_list, std::regex("(^|\\s)pmix(\\s|$)"));
  if (job.elastic) {
    // The supervisor relaunches mpirun on the nodes that answer (Note [elastic supervisor]).
    if (job.launcher == "srun") {
      throw ConfigError("command line: --elastic runs mpirun under batchdist elastic; drop --launcher srun");
    }
    job.launcher = "mpirun";
    job.launcher_reason = "--elastic: batchdist elastic runs mpirun on the nodes that answer";
    return;
  }
  if (job.launcher == "srun") {
    job.launcher_reason = has_pmix ? "--launcher srun; `srun --mpi=list` lists pmix"
                                   : "--launcher srun, although `srun --mpi=list` did not list "
                                     "pmix here";
  } else if (job.launcher == "mpirun") {
    job.launcher_reason = "--launcher mpirun";
  } else if (has_pmix) {
    job.launcher = "srun";
    job.launcher_reason = "`srun --mpi=list` lists pmix";
  } else {
    job.launcher = "mpirun";
    job.launcher_reason = srun_mpi_list.empty()
                              ? "`srun --mpi=list` did not run here; --launcher srun overrides"
                              : "`srun --mpi=list` lists no pmix plugin";
  }
}

std::pair<std::string, int> runCommand(const std::string& command) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return {"", -1};
  std::string out;
  std::array<char, 1024> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = pclose(p);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)};
}

std::string probeSrunMpiList() {
  // `timeout` bounds a hung controller; stderr holds the list in some versions.
  const auto [out, status] = runCommand("timeout 20 srun --mpi=list");
  return status == 0 ? out : "";
}

std::string submitSlurmScript(const std::string& script) {
  auto [out, status] = runCommand("timeout 120 sbatch --parsable " + shellQuote(script));
  while (!out.empty() && std::isspace(static_cast<unsigned char>(out.back()))) out.pop_back();
  const std::string id = out.substr(0, out.find(';'));  // "id" or "id;cluster"
  if (status == 0 && !id.empty() && id.find_first_not_of("0123456789") == std::string::npos) {
    return id;
  }
  throw Error(strCat("sbatch ", script, " failed (",
                     status == -1 ? std::string("could not start it")
                     : status == 124 ? std::string("no answer within 120 s")
                                     : strCat("exit ", status),
                     "): ", out.empty() ? std::string("no output") : out,
                     ". Run batchdist slurm where sbatch works (a login node), or submit the "
                     "script by hand"));
}

std::string shellQuote(const std::string& word) {
  if (!word.empty() && std::regex_match(word, std::regex("[A-Za-z0-9_./:=@,+-]+"))) return word;
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

namespace {

/// What every start of the run gets: --resume auto (requeue), the --set keys, and
/// train.threads from --cpus-per-task.
std::string runArguments(const SlurmJobSpec& job) {
  std::ostringstream cmd;
  if (job.requeue) cmd << " --resume auto";
  for (const auto& set : job.sets) cmd << " \\\n    --set " << shellQuote(set);
  const bool threads_set = std::any_of(job.sets.begin(), job.sets.end(), [](const std::string& x) {
    return x.rfind("train.threads=", 0) == 0;
  });
  if (job.cpus_per_task > 0 && !threads_set) {
    cmd << " \\\n    --set train.threads=" << job.cpus_per_task;
  }
  return cmd.str();
}

/// --elastic: the supervisor in place of mpirun, on the allocation's nodes.
std::string elasticLauncher(const SlurmJobSpec& job) {
  std::ostringstream s;
  s << "# batchdist elastic runs mpirun on the allocation's nodes that answer (asked of\n"
    << "# scontrol at each look) and watches the ranks' heartbeats: a lost node ends the\n"
    << "# attempt, and the job goes on from its newest checkpoint on the others, with the\n"
    << "# same global batch (docs/elastic.md). SIGUSR1 (the time limit) and SIGTERM reach\n"
    << "# it through the traps below: it stops the job at a step boundary with a checkpoint.\n"
    << shellQuote(job.binary) << " elastic " << shellQuote(job.config) << " --output \"$OUT\""
    << " \\\n  --hosts-command 'scontrol show hostnames \"$SLURM_JOB_NODELIST\"' --slots-per-host "
    << job.tasks_per_node << " \\\n  --mpirun-args '--bind-to none --mca odls_base_sigkill_timeout "
    << kMpirunStopGraceS << "'" << runArguments(job) << " &\n";
  return s.str();
}

}  // namespace

std::string slurmScript(const SlurmJobSpec& job) {
  const int world = job.nodes * job.tasks_per_node;
  const bool gpu = job.gpus_per_node > 0;
  const bool srun = job.launcher == "srun";
  std::ostringstream s;
  s << "#!/bin/bash\n"
    << "# batchdist on Slurm: " << job.config << "\n"
    << "# " << job.nodes << " node(s) x " << job.tasks_per_node << " rank(s) = world size " << world
    << (gpu ? ", one GPU per rank" : ", on CPUs") << ". Written by `batchdist slurm` (batchdist "
    << BATCHDIST_VERSION << ").\n"
    << "# Submit: sbatch " << job.script << "\n"
    << "# Rank 0 prints progress to the job log; every run writes report.json and model.pt to\n"
    << "# " << job.output << "/<job id>/.\n"
    << "#\n"
    << "# Job name (squeue, and %x in the log file name).\n"
    << "#SBATCH --job-name=" << job.job_name << "\n"
    << "# Hosts. Ranks on different hosts rendezvous over TCP (see BATCHDIST_IFNAME below).\n"
    << "#SBATCH --nodes=" << job.nodes << "\n";
  if (gpu) {
    s << "# One rank (Slurm task) per GPU on every node: world size = nodes x tasks per node.\n"
      << "#SBATCH --ntasks-per-node=" << job.tasks_per_node << "\n"
      << "# One GPU per rank: " << job.gpus_per_node << " per node, " << job.nodes * job.gpus_per_node
      << " in all.\n"
      << "#SBATCH --gpus-per-task=1\n"
      << "# Each rank sees all the job's GPUs on its node and binds GPU = local rank\n"
      << "# (MPI_COMM_TYPE_SHARED) itself; Slurm's per-task binding, implied by --gpus-per-task,\n"
      << "# would show every rank only its own GPU, as cuda:0.\n"
      << "#SBATCH --gpu-bind=none\n";
  } else {
    s << "# Ranks (Slurm tasks) per node, on CPUs: world size = nodes x tasks per node.\n"
      << "#SBATCH --ntasks-per-node=" << job.tasks_per_node << "\n";
  }
  if (job.cpus_per_task > 0) {
    s << "# CPU cores per rank; batchdist runs that many intra-op threads (train.threads).\n"
      << "#SBATCH --cpus-per-task=" << job.cpus_per_task << "\n";
  }
  if (!job.partition.empty()) {
    s << "# Partition (queue).\n"
      << "#SBATCH --partition=" << job.partition << "\n";
  }
  if (!job.time.empty()) {
    s << "# Wall-clock limit.\n"
      << "#SBATCH --time=" << job.time << "\n";
  }
  s << "# SIGUSR1 " << job.signal_before_s << " s before the time limit";
  if (srun) {
    s << " to every rank: they all stop after the same\n";
  } else {
    s << " to this script (B:), which passes it to\n"
      << "# mpirun, and mpirun to every rank: they all stop after the same\n";
  }
  s << "# step, rank 0 writes model.pt and report.json (\"completed\": false) and the job exits\n"
    << "# 138 (128 + SIGUSR1). Slurm checks the limit about once a minute, so it may come early.\n"
    << "#SBATCH --signal=" << (srun ? "" : "B:") << "USR1@" << job.signal_before_s << "\n";
  if (job.requeue) {
    s << "# The stop writes a checkpoint first; with training unfinished (exit 138) the job\n"
      << "# requeues itself (end of this script) and its next start resumes from the\n"
      << "# checkpoint (--resume auto), with the same job id and so the same $OUT.\n"
      << "#SBATCH --requeue\n"
      << "# One log for all the starts of this job.\n"
      << "#SBATCH --open-mode=append\n";
  }
  s << "# stdout and stderr of the whole job (%x job name, %j job id).\n"
    << "#SBATCH --output=" << job.output << "/%x-%j.out\n"
    << "# Working directory of the job.\n"
    << "#SBATCH --chdir=" << job.workdir << "\n"
    << "\n"
    << "set -u\n"
    << ": \"${SLURM_JOB_ID:?submit this script with sbatch}\"\n"
    << "\n"
    << "# Rendezvous: rank 0 opens a TCPStore on the address of BATCHDIST_IFNAME (or the\n"
    << "# config's dist.interface) and sends \"host:port\" to the other ranks over MPI; Gloo and\n"
    << "# NCCL use the same interface. Unset: loopback when all ranks share a node, else the\n"
    << "# first non-loopback interface. Across nodes name one every node has (ib0, eth0, ...).\n";
  if (!job.interface.empty()) {
    s << "export BATCHDIST_IFNAME=" << job.interface << "\n"
      << "# Open MPI's own TCP traffic (start-up, and messages without a faster fabric) on it too.\n"
      << "export OMPI_MCA_oob_tcp_if_include=" << job.interface << "\n"
      << "export OMPI_MCA_btl_tcp_if_include=" << job.interface << "\n";
  } else {
    s << "# export BATCHDIST_IFNAME=eth0\n"
      << "# Open MPI's own TCP traffic (start-up, and messages without a faster fabric):\n"
      << "# export OMPI_MCA_oob_tcp_if_include=eth0 OMPI_MCA_btl_tcp_if_include=eth0\n";
  }
  s << "\n"
    << "OUT=" << shellQuote(job.output) << "/${SLURM_JOB_ID}\n"
    << "mkdir -p \"$OUT\"\n"
    << "echo \"batchdist: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}: ${SLURM_NTASKS} ranks, "
    << "output in $OUT\"\n\n";

  std::ostringstream cmd;
  cmd << shellQuote(job.binary) << " train " << shellQuote(job.config) << " --output \"$OUT\""
      << runArguments(job);

  if (srun) {
    s << "# Launcher: srun (" << job.launcher_reason << ").\n"
      << "# srun starts the ranks and PMIx wires them into one MPI world (Open MPI joins a\n"
      << "# Slurm step through PMIx).\n"
      << "# Without --mpi=pmix each task would be a world of 1; batchdist refuses to start then.\n"
      << "# --kill-on-bad-exit: a rank that fails ends the whole step at once.\n"
      << "srun --mpi=pmix --kill-on-bad-exit=1";
    if (gpu) s << " --gpu-bind=none";
    // Slurm 22.05's srun does not inherit --cpus-per-task from sbatch.
    if (job.cpus_per_task > 0) s << " --cpus-per-task=" << job.cpus_per_task;
    s << " \\\n  " << cmd.str() << "\n"
      << "rc=$?\n";
  } else {
    s << "# Launcher: mpirun (" << job.launcher_reason << ").\n"
      << "# mpirun finds the allocation itself and starts one Open MPI daemon per node\n"
      << "# through srun, the ranks under it.\n";
    if (gpu) {
      s << "# The daemons' step must see every GPU of its node, not the one GPU that\n"
        << "# SLURM_GPUS_PER_TASK would give a step of one task per node.\n"
        << "unset SLURM_GPUS_PER_TASK SLURM_GPU_BIND\n";
    }
    if (job.elastic) {
      s << elasticLauncher(job);
    } else {
    s << "# Told to terminate (scancel, the time limit, a plain kill of this script), mpirun\n"
      << "# cannot forward SIGTERM: it sends the ranks SIGCONT, then SIGTERM\n"
      << "# odls_base_sigkill_timeout seconds later, then SIGKILL as long after that. Open\n"
      << "# MPI's default, 1 s, kills the ranks before they checkpoint; 30 s gives them\n"
      << "# Slurm's usual KillWait (30 s) to stop after the same step, as SIGUSR1 does.\n"
      << "mpirun -np \"$SLURM_NTASKS\" --map-by ppr:" << job.tasks_per_node
      << ":node --bind-to none \\\n  --mca odls_base_sigkill_timeout " << kMpirunStopGraceS
      << " \\\n  " << cmd.str() << " &\n";
    }
    s << "launcher=$!\n"
      << "# Pass the stop signal (and scancel's SIGTERM) on to mpirun, then wait for the ranks;\n"
      << "# a trapped signal interrupts `wait`, so wait again until mpirun has exited.\n"
      << "trap 'kill -USR1 \"$launcher\" 2>/dev/null' USR1\n"
      << "trap 'kill -TERM \"$launcher\" 2>/dev/null' TERM\n"
      << "while :; do wait \"$launcher\"; kill -0 \"$launcher\" 2>/dev/null || break; done\n"
      << "wait \"$launcher\"\n"
      << "rc=$?\n";
  }
  if (job.requeue) {
    s << "# 138 = 128 + SIGUSR1: stopped before the time limit after a checkpoint, training\n"
      << "# not finished. Requeue (same job id, same $OUT): the next start resumes.\n"
      << "if [ \"$rc\" = 138 ]; then\n"
      << "  echo \"batchdist: job ${SLURM_JOB_ID} stopped before its time limit with a checkpoint; "
      << "requeueing it to resume (start $(( ${SLURM_RESTART_COUNT:-0} + 1 )))\"\n"
      << "  scontrol requeue \"$SLURM_JOB_ID\"\n"
      << "fi\n";
  }
  s << "exit \"$rc\"\n";
  return s.str();
}

SlurmPmi mpiSlurmPmiSupport() {
#if defined(OPEN_MPI)
  namespace fs = std::filesystem;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&MPI_Init), &info) == 0 || info.dli_fname == nullptr) {
    return SlurmPmi::kUnknown;
  }
  std::error_code ec;
  const fs::path lib = fs::canonical(info.dli_fname, ec);
  if (ec) return SlurmPmi::kUnknown;
  // Upstream installs the plugins in LIBDIR/openmpi, Debian in LIBDIR/openmpi/lib/openmpi3.
  const fs::path dir = lib.parent_path();
  for (const fs::path& plugins : {dir / "openmpi", dir / "openmpi/lib/openmpi3",
                                  dir / "openmpi/lib/openmpi"}) {
    if (!fs::exists(plugins / "mca_ess_pmi.so", ec)) continue;
    return fs::exists(plugins / "mca_pmix_s1.so", ec) || fs::exists(plugins / "mca_pmix_s2.so", ec)
               ? SlurmPmi::kYes
               : SlurmPmi::kNo;
  }
#endif
  return SlurmPmi::kUnknown;
}

std::string srunLaunchProblem(const EnvLookup& env, SlurmPmi pmi) {
  const char* skip = get(env, "BATCHDIST_SKIP_SRUN_CHECK");
  if (skip && std::string(skip) == "1") return "";
  if (pmi != SlurmPmi::kNo) return "";
  if (!get(env, "SLURM_PROCID") || !get(env, "SLURM_STEP_ID")) return "";
  // Wired up by mpirun's daemon, or by srun's PMIx.
  for (const char* pm : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMIX_NAMESPACE"}) {
    if (get(env, pm)) return "";
  }
  const int tasks = envInt(env, "SLURM_STEP_NUM_TASKS");
  return strCat("srun started this process as ", stepDescription(env),
                ", but this Open MPI joins a Slurm step only through PMIx (it has no PMI-1/PMI-2 "
                "support), so MPI_Init would fail",
                tasks > 1 ? strCat(" or start ", tasks, " independent copies instead of one job")
                          : std::string(),
                ". ", kSrunFix, ". (BATCHDIST_SKIP_SRUN_CHECK=1 skips this check.)");
}

std::string srunWorldProblem(const EnvLookup& env, int world) {
  const char* skip = get(env, "BATCHDIST_SKIP_SRUN_CHECK");
  if (skip && std::string(skip) == "1") return "";
  if (world != 1 || !get(env, "SLURM_PROCID") || !get(env, "SLURM_STEP_ID")) return "";
  const int tasks = envInt(env, "SLURM_STEP_NUM_TASKS");
  if (tasks <= 1 || get(env, "OMPI_COMM_WORLD_SIZE")) return "";
  return strCat("MPI sees a world of 1, but srun started this process as ", stepDescription(env),
                ": the MPI library did not join the step, so ", tasks,
                " copies would train independently. ", kSrunFix,
                ". (BATCHDIST_SKIP_SRUN_CHECK=1 skips this check.)");
}

}  // namespace batchdist::launcher
