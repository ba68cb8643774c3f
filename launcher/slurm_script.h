#pragma once
// `batchdist slurm`: writes an sbatch script that runs this config on a Slurm
// allocation (and submits it), and the checks batchdist makes when a Slurm
// job step started it. The text generator is pure, so it is unit-tested.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace batchdist::launcher {

/// What the user asked `batchdist slurm` for, after the command line.
struct SlurmJobSpec {
  std::string config;              ///< absolute path of the config
  std::vector<std::string> sets;   ///< --set overrides, forwarded to every rank
  std::string output;              ///< absolute dir: job logs, one run dir per job id
  std::string binary;              ///< absolute path of batchdist on the nodes
  std::string workdir;             ///< sbatch --chdir
  int nodes = 1;
  int gpus_per_node = -1;          ///< required; 0 = CPU job
  int tasks_per_node = 0;          ///< ranks per node: = gpus_per_node, or --tasks-per-node
  int cpus_per_task = 0;           ///< 0: not set (Slurm's default)
  std::string partition;           ///< empty: the cluster's default partition
  std::string time;                ///< Slurm time limit as given ("1:00:00"); empty: partition default
  int signal_before_s = -1;        ///< SIGUSR1 this many s before the limit; -1: default
  std::string job_name;            ///< empty: batchdist-<config stem>
  std::string launcher = "auto";   ///< auto | srun | mpirun
  std::string launcher_reason;     ///< why (after resolveLauncher)
  std::string interface;           ///< dist.interface for every rank and Open MPI's TCP
  std::string script;              ///< where to write; empty: OUTPUT/<job name>.sbatch
  bool submit = false;
  /// On the stop signal before the time limit: checkpoint, requeue the job if
  /// training is not finished (batchdist exits 138), resume with --resume auto.
  bool requeue = true;
  /// --elastic: the script runs `batchdist elastic` on the allocation's nodes
  /// (Note [elastic supervisor]) instead of mpirun: a lost node ends the attempt
  /// and the job goes on on the others, the same global batch. mpirun only.
  bool elastic = false;
};

/// Seconds in a Slurm time limit: "M", "M:S", "H:M:S", "D-H", "D-H:M", "D-H:M:S".
/// Throws ConfigError for anything else (or zero, or "UNLIMITED": batchdist
/// wants a limit it can stop cleanly before).
int64_t parseSlurmTime(const std::string& text);

/// Default lead of the stop signal: 120 s, or a quarter of a shorter limit.
int defaultSignalLead(int64_t limit_s);

/// Fills defaults (tasks per node, job name, signal lead, script path) and checks
/// the combination; throws ConfigError naming the option and what to pass.
void completeSlurmJob(SlurmJobSpec& job);

/// Picks srun or mpirun for launcher "auto" from `srun --mpi=list` output (empty
/// when srun is missing or failed): srun --mpi=pmix when this Slurm has PMIx,
/// which Debian's Open MPI uses, else mpirun. Sets launcher and launcher_reason.
void resolveLauncher(SlurmJobSpec& job, const std::string& srun_mpi_list);

/// Runs `srun --mpi=list` (bounded by a timeout); its output, empty on failure.
std::string probeSrunMpiList();

/// Output (stdout and stderr) and exit status of a shell command (128 + signal
/// when one killed it); status -1 when it could not be started.
std::pair<std::string, int> runCommand(const std::string& command);

/// The sbatch script for `job` (completed and resolved).
std::string slurmScript(const SlurmJobSpec& job);

/// Seconds mpirun leaves the ranks between SIGTERM and SIGKILL when it is told to
/// terminate (`--mca odls_base_sigkill_timeout`; docs/clusters.md, "Stopping a job
/// started by mpirun"): enough for the stop-signal checkpoint and the report.
constexpr int kMpirunStopGraceS = 30;

/// Runs `sbatch --parsable SCRIPT` (bounded by a timeout) and returns the job id;
/// throws Error with sbatch's own message when it fails.
std::string submitSlurmScript(const std::string& script);

/// A word for sh: single-quoted unless it is plainly safe.
std::string shellQuote(const std::string& word);

// --- Started by Slurm ------------------------------------------------------

/// Environment lookup (getenv in batchdist, a map in the tests).
using EnvLookup = std::function<const char*(const char*)>;

/// Whether the linked MPI can join a srun step through Slurm's PMI-1/PMI-2 (not
/// PMIx). Open MPI 4 only can with its s1/s2 components, which Debian's lacks.
enum class SlurmPmi { kYes, kNo, kUnknown };

/// Open MPI: looks for the s1/s2 components next to the other MCA plugins of the
/// libmpi this process loaded; kUnknown when it cannot tell or for other MPIs.
SlurmPmi mpiSlurmPmiSupport();

/// Before MPI_Init (Open MPI builds): a task of a srun step that neither PMIx nor
/// mpirun wired up (srun --mpi=none or pmi2, e.g. a cluster's MpiDefault) makes
/// Open MPI abort in MPI_Init with a generic message, or, where it falls back to
/// singletons, N independent copies. When `pmi` is kNo, returns an error message
/// naming the fix (srun --mpi=pmix, or mpirun); otherwise, or when the launch
/// looks sound, "". BATCHDIST_SKIP_SRUN_CHECK=1 disables it.
std::string srunLaunchProblem(const EnvLookup& env, SlurmPmi pmi);

/// After MPI_Init: MPI says world size `world` but Slurm started this task as one
/// of SLURM_STEP_NUM_TASKS > world (an MPI without the step's PMI fell back to
/// singletons: N independent copies). Returns the message, or "".
std::string srunWorldProblem(const EnvLookup& env, int world);

}  // namespace batchdist::launcher
