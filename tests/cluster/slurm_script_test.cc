// `batchdist slurm`: the sbatch text, its option checks, the srun launch checks,
// and the verb as a user runs it (exit codes, messages, --submit against a
// stand-in sbatch). The real Slurm runs are in slurm_test.sh.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "common/error.h"
#include "launcher/slurm_script.h"
#include "../command.h"
#include "../scratch_dir.h"

namespace fs = std::filesystem;
using batchdist::ConfigError;
using namespace batchdist::launcher;

namespace {

using Result = batchdist::testsupport::CommandResult;

Result sh(const std::string& cmd) { return batchdist::testsupport::runCommand(cmd); }

/// A new directory of this test process's own (Note [scratch dirs]), removed when it ends.
fs::path tempDir(const std::string& name) {
  return batchdist::testsupport::scratchDir("slurm_test_" + name);
}

const std::string kQuickstart = std::string(BATCHDIST_SOURCE_DIR) + "/configs/quickstart.yaml";

SlurmJobSpec gpuJob() {
  SlurmJobSpec j;
  j.config = "/data/cfg/train.yaml";
  j.sets = {"train.epochs=5"};
  j.output = "/scratch/runs";
  j.binary = "/opt/batchdist/bin/batchdist";
  j.workdir = "/home/me";
  j.nodes = 2;
  j.gpus_per_node = 8;
  j.cpus_per_task = 8;
  j.partition = "gpu";
  j.time = "04:00:00";
  j.interface = "ib0";
  return j;
}

std::string generate(SlurmJobSpec j, const std::string& mpi_list) {
  completeSlurmJob(j);
  resolveLauncher(j, mpi_list);
  return slurmScript(j);
}

const char* kListWithPmix =
    "MPI plugin types are...\n\tpmix\n\tnone\n\tcray_shasta\n\tpmi2\nspecific pmix plugin "
    "versions available: pmix_v4\n";
const char* kListWithoutPmix = "MPI plugin types are...\n\tnone\n\tpmi2\n";

bool contains(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

/// bash -n on the text: the script parses.
void expectValidBash(const std::string& script) {
  const auto path = tempDir("syntax") / "job.sbatch";
  std::ofstream(path) << script;
  const auto r = sh("bash -n " + path.string());
  EXPECT_EQ(r.code, 0) << r.out << "\n" << script;
}

EnvLookup envOf(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

}  // namespace

TEST(SlurmTime, SlurmsForms) {
  EXPECT_EQ(parseSlurmTime("30"), 30 * 60);
  EXPECT_EQ(parseSlurmTime("1:30"), 90);
  EXPECT_EQ(parseSlurmTime("2:00:00"), 7200);
  EXPECT_EQ(parseSlurmTime("1-0"), 86400);
  EXPECT_EQ(parseSlurmTime("1-2:30"), 86400 + 2 * 3600 + 30 * 60);
  EXPECT_EQ(parseSlurmTime("1-2:3:4"), 86400 + 2 * 3600 + 3 * 60 + 4);
  for (const char* bad : {"", "abc", "1:2:3:4", "-5", "1-", "UNLIMITED", "0", "1::2", "1:", "0:00",
                          "2h", "1-2:3:4:5"}) {
    EXPECT_THROW(parseSlurmTime(bad), ConfigError) << "'" << bad << "'";
  }
  try {
    parseSlurmTime("2h");
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "HOURS:MINUTES:SECONDS")) << e.what();
  }
}

TEST(SlurmJob, DefaultsAndChecks) {
  auto j = gpuJob();
  completeSlurmJob(j);
  EXPECT_EQ(j.tasks_per_node, 8);
  EXPECT_EQ(j.signal_before_s, 120);
  EXPECT_EQ(j.job_name, "batchdist-train");
  EXPECT_EQ(j.script, "/scratch/runs/batchdist-train.sbatch");

  j = gpuJob();
  j.time = "1";  // 60 s: a quarter of it
  completeSlurmJob(j);
  EXPECT_EQ(j.signal_before_s, 15);

  auto expectError = [](SlurmJobSpec job, const std::string& message) {
    try {
      completeSlurmJob(job);
      ADD_FAILURE() << "no error, expected '" << message << "'";
    } catch (const ConfigError& e) {
      EXPECT_TRUE(contains(e.what(), message)) << e.what();
    }
  };
  j = gpuJob();
  j.gpus_per_node = -1;
  expectError(j, "needs --gpus-per-node G");
  j = gpuJob();
  j.gpus_per_node = 0;
  j.tasks_per_node = 0;
  expectError(j, "--tasks-per-node T");
  j = gpuJob();
  j.tasks_per_node = 4;
  expectError(j, "one rank per GPU");
  j = gpuJob();
  j.signal_before_s = 14400;
  expectError(j, "not shorter than --time 04:00:00 (14400 s)");
  j = gpuJob();
  j.nodes = 0;
  expectError(j, "--nodes must be >= 1");
  j = gpuJob();
  j.launcher = "ssh";
  expectError(j, "use auto, srun or mpirun");
  j = gpuJob();
  j.output = "/scratch/my runs";
  expectError(j, "without them");
  j = gpuJob();
  j.interface = "eth0; rm -rf /";
  expectError(j, "not a network interface name");
}

TEST(SlurmJob, LauncherFollowsSrunMpiList) {
  auto j = gpuJob();
  resolveLauncher(j, kListWithPmix);
  EXPECT_EQ(j.launcher, "srun");
  j = gpuJob();
  resolveLauncher(j, kListWithoutPmix);
  EXPECT_EQ(j.launcher, "mpirun");
  EXPECT_TRUE(contains(j.launcher_reason, "no pmix")) << j.launcher_reason;
  j = gpuJob();
  resolveLauncher(j, "");  // srun missing or failing here
  EXPECT_EQ(j.launcher, "mpirun");
  j = gpuJob();
  j.launcher = "mpirun";
  resolveLauncher(j, kListWithPmix);
  EXPECT_EQ(j.launcher, "mpirun");
  j = gpuJob();
  j.launcher = "srun";
  resolveLauncher(j, "");
  EXPECT_EQ(j.launcher, "srun");
}

TEST(SlurmScript, GpuJobWithSrun) {
  const auto s = generate(gpuJob(), kListWithPmix);
  for (const char* line :
       {"#!/bin/bash\n", "\n#SBATCH --job-name=batchdist-train\n", "\n#SBATCH --nodes=2\n",
        "\n#SBATCH --ntasks-per-node=8\n", "\n#SBATCH --gpus-per-task=1\n",
        "\n#SBATCH --gpu-bind=none\n", "\n#SBATCH --cpus-per-task=8\n",
        "\n#SBATCH --partition=gpu\n", "\n#SBATCH --time=04:00:00\n",
        "\n#SBATCH --signal=USR1@120\n", "\n#SBATCH --output=/scratch/runs/%x-%j.out\n",
        "\n#SBATCH --chdir=/home/me\n", "\nexport BATCHDIST_IFNAME=ib0\n",
        "\nexport OMPI_MCA_oob_tcp_if_include=ib0\n", "\nexport OMPI_MCA_btl_tcp_if_include=ib0\n",
        "\nOUT=/scratch/runs/${SLURM_JOB_ID}\n",
        "\nsrun --mpi=pmix --kill-on-bad-exit=1 --gpu-bind=none --cpus-per-task=8 \\\n"
        "  /opt/batchdist/bin/batchdist train /data/cfg/train.yaml --output \"$OUT\" --resume auto \\\n"
        "    --set train.epochs=5 \\\n    --set train.threads=8\nrc=$?\n",
        "\n#SBATCH --requeue\n", "\n#SBATCH --open-mode=append\n",
        "\nif [ \"$rc\" = 138 ]; then\n", "\n  scontrol requeue \"$SLURM_JOB_ID\"\nfi\nexit \"$rc\"\n"}) {
    EXPECT_TRUE(contains(s, line)) << "missing:\n" << line << "\nin:\n" << s;
  }
  EXPECT_FALSE(contains(s, "mpirun -np"));
  EXPECT_FALSE(contains(s, "B:USR1"));
  expectValidBash(s);
}

TEST(SlurmScript, EveryDirectiveIsExplained) {
  for (const char* list : {kListWithPmix, kListWithoutPmix}) {
    std::istringstream in(generate(gpuJob(), list));
    std::string prev, line;
    int directives = 0;
    while (std::getline(in, line)) {
      if (line.rfind("#SBATCH", 0) == 0) {
        ++directives;
        EXPECT_TRUE(prev.rfind("# ", 0) == 0 || prev.rfind("#SBATCH", 0) == 0)
            << "no comment above '" << line << "'";
        if (prev.rfind("#SBATCH", 0) == 0) ADD_FAILURE() << "two directives in a row: " << line;
      }
      prev = line;
    }
    EXPECT_EQ(directives, 13);
  }
}

// --no-requeue: the stop alone, as before checkpoints existed.
TEST(SlurmScript, NoRequeueStopsOnly) {
  auto j = gpuJob();
  j.requeue = false;
  const auto s = generate(j, kListWithPmix);
  EXPECT_FALSE(contains(s, "--requeue"));
  EXPECT_FALSE(contains(s, "--open-mode"));
  EXPECT_FALSE(contains(s, "--resume auto"));
  EXPECT_FALSE(contains(s, "scontrol requeue"));
  EXPECT_TRUE(contains(s, "\nexit \"$rc\"\n"));
  expectValidBash(s);
}

TEST(SlurmScript, GpuJobWithMpirunForwardsTheSignal) {
  const auto s = generate(gpuJob(), kListWithoutPmix);
  for (const char* line :
       {"\n#SBATCH --signal=B:USR1@120\n", "\nunset SLURM_GPUS_PER_TASK SLURM_GPU_BIND\n",
        "\nmpirun -np \"$SLURM_NTASKS\" --map-by ppr:8:node --bind-to none \\\n",
        // The ranks get time to checkpoint when mpirun is told to terminate.
        "\n  --mca odls_base_sigkill_timeout 30 \\\n",
        "--set train.threads=8 &\nlauncher=$!\n",
        "\ntrap 'kill -USR1 \"$launcher\" 2>/dev/null' USR1\n",
        "\ntrap 'kill -TERM \"$launcher\" 2>/dev/null' TERM\n", "\nwait \"$launcher\"\nrc=$?\n",
        "\n  scontrol requeue \"$SLURM_JOB_ID\"\n"}) {
    EXPECT_TRUE(contains(s, line)) << "missing:\n" << line << "\nin:\n" << s;
  }
  EXPECT_FALSE(contains(s, "\nsrun "));
  expectValidBash(s);
}

// --elastic: the supervisor in place of mpirun (Note [elastic supervisor]), on the
// allocation's nodes, with the same stop and requeue as an mpirun job.
TEST(SlurmScript, ElasticRunsTheSupervisorOnTheAllocationsNodes) {
  auto j = gpuJob();
  j.elastic = true;
  const auto s = generate(j, kListWithPmix);  // pmix or not: mpirun under the supervisor
  for (const char* line :
       {"\n#SBATCH --signal=B:USR1@120\n", "\nunset SLURM_GPUS_PER_TASK SLURM_GPU_BIND\n",
        "\n/opt/batchdist/bin/batchdist elastic /data/cfg/train.yaml --output \"$OUT\" \\\n"
        "  --hosts-command 'scontrol show hostnames \"$SLURM_JOB_NODELIST\"' --slots-per-host 8 \\\n"
        "  --mpirun-args '--bind-to none --mca odls_base_sigkill_timeout 30' --resume auto",
        "--set train.threads=8 &\nlauncher=$!\n",
        "\ntrap 'kill -USR1 \"$launcher\" 2>/dev/null' USR1\n",
        "\ntrap 'kill -TERM \"$launcher\" 2>/dev/null' TERM\n",
        "\n  scontrol requeue \"$SLURM_JOB_ID\"\n"}) {
    EXPECT_TRUE(contains(s, line)) << "missing:\n" << line << "\nin:\n" << s;
  }
  EXPECT_FALSE(contains(s, "mpirun -np"));
  EXPECT_FALSE(contains(s, "\nsrun "));
  expectValidBash(s);
  j.launcher = "srun";
  try {
    generate(j, kListWithPmix);
    ADD_FAILURE() << "--elastic with --launcher srun was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--elastic runs mpirun under batchdist elastic; drop --launcher srun"),
              std::string::npos);
  }
}

TEST(SlurmScript, CpuJob) {
  auto j = gpuJob();
  j.gpus_per_node = 0;
  j.tasks_per_node = 4;
  j.cpus_per_task = 0;
  j.partition.clear();
  j.time.clear();
  j.interface.clear();
  const auto s = generate(j, kListWithPmix);
  EXPECT_TRUE(contains(s, "\n#SBATCH --ntasks-per-node=4\n")) << s;
  EXPECT_TRUE(contains(s, "world size 8, on CPUs")) << s;
  EXPECT_TRUE(contains(s, "\n# export BATCHDIST_IFNAME=eth0\n")) << s;
  EXPECT_TRUE(contains(s, "\nsrun --mpi=pmix --kill-on-bad-exit=1 \\\n")) << s;
  for (const char* absent : {"gpu", "--partition", "--time", "--cpus-per-task", "train.threads",
                             "\nexport BATCHDIST_IFNAME"}) {
    EXPECT_FALSE(contains(s, absent)) << absent << " in:\n" << s;
  }
  expectValidBash(s);
}

TEST(SlurmScript, ThreadsFromTheUserWin) {
  auto j = gpuJob();
  j.sets.push_back("train.threads=3");
  const auto s = generate(j, kListWithPmix);
  EXPECT_TRUE(contains(s, "--set train.threads=3")) << s;
  EXPECT_FALSE(contains(s, "--set train.threads=8")) << s;
}

TEST(SlurmScript, OddPathsAndValuesSurviveTheShell) {
  auto j = gpuJob();
  j.config = "/data/my configs/it's.yaml";
  j.sets = {"model.hidden=[256, 128]", "data.path=$HOME/x"};
  const auto s = generate(j, kListWithPmix);
  expectValidBash(s);
  // The quoted words come back unchanged from the shell.
  const auto words = sh("printf '<%s>' " + shellQuote(j.config) + " " + shellQuote(j.sets[0]) +
                        " " + shellQuote(j.sets[1]));
  EXPECT_EQ(words.out, "</data/my configs/it's.yaml><model.hidden=[256, 128]><data.path=$HOME/x>");
  EXPECT_EQ(shellQuote("train.epochs=5"), "train.epochs=5");
}

TEST(SrunChecks, LaunchWithoutPmixIsRefusedBeforeMpiInit) {
  const std::map<std::string, std::string> step = {
      {"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "4"}};
  auto msg = srunLaunchProblem(envOf(step), SlurmPmi::kNo);
  EXPECT_TRUE(contains(msg, "task 0 of a 4-task srun step (SLURM_MPI_TYPE=unset)")) << msg;
  EXPECT_TRUE(contains(msg, "4 independent copies")) << msg;
  EXPECT_TRUE(contains(msg, "srun --mpi=pmix")) << msg;

  auto with = [&](std::map<std::string, std::string> extra) {
    extra.insert(step.begin(), step.end());
    return srunLaunchProblem(envOf(extra), SlurmPmi::kNo);
  };
  msg = with({{"SLURM_MPI_TYPE", "pmi2"}, {"PMI_FD", "5"}});
  EXPECT_TRUE(contains(msg, "SLURM_MPI_TYPE=pmi2")) << msg;
  EXPECT_EQ(with({{"PMIX_RANK", "0"}, {"PMIX_NAMESPACE", "slurm.pmix.1.0"}}), "");  // srun --mpi=pmix
  EXPECT_EQ(with({{"OMPI_COMM_WORLD_SIZE", "4"}}), "");  // mpirun's daemon started it
  EXPECT_EQ(with({{"BATCHDIST_SKIP_SRUN_CHECK", "1"}}), "");
  // The batch script itself (no step) and runs outside Slurm are fine.
  EXPECT_EQ(srunLaunchProblem(envOf({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}}), SlurmPmi::kNo),
            "");
  EXPECT_EQ(srunLaunchProblem(envOf({}), SlurmPmi::kNo), "");
  // An MPI that speaks Slurm's PMI (or one we cannot tell) is left to MPI_Init.
  EXPECT_EQ(srunLaunchProblem(envOf(step), SlurmPmi::kYes), "");
  EXPECT_EQ(srunLaunchProblem(envOf(step), SlurmPmi::kUnknown), "");
}

TEST(SrunChecks, SingletonsOfAStepAreRefusedAfterMpiInit) {
  const std::map<std::string, std::string> step = {{"SLURM_PROCID", "2"},
                                                   {"SLURM_STEP_ID", "0"},
                                                   {"SLURM_STEP_NUM_TASKS", "4"},
                                                   {"SLURM_MPI_TYPE", "pmi2"}};
  const auto msg = srunWorldProblem(envOf(step), 1);
  EXPECT_TRUE(contains(msg, "MPI sees a world of 1")) << msg;
  EXPECT_TRUE(contains(msg, "4 copies would train independently")) << msg;
  EXPECT_EQ(srunWorldProblem(envOf(step), 4), "");
  auto under_mpirun = step;
  under_mpirun["OMPI_COMM_WORLD_SIZE"] = "1";  // mpirun -np 1 inside an allocation
  EXPECT_EQ(srunWorldProblem(envOf(under_mpirun), 1), "");
  auto one_task = step;
  one_task["SLURM_STEP_NUM_TASKS"] = "1";
  EXPECT_EQ(srunWorldProblem(envOf(one_task), 1), "");
}

TEST(SrunChecks, DebianOpenMpiHasNoSlurmPmi) {
  // Debian 12's Open MPI joins Slurm steps through PMIx only (no s1/s2 components).
  const fs::path debian = "/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3";
  if (!fs::exists(debian / "mca_ess_pmi.so")) GTEST_SKIP() << "not Debian's Open MPI layout";
  if (fs::exists(debian / "mca_pmix_s1.so") || fs::exists(debian / "mca_pmix_s2.so")) {
    EXPECT_EQ(mpiSlurmPmiSupport(), SlurmPmi::kYes);
  } else {
    EXPECT_EQ(mpiSlurmPmiSupport(), SlurmPmi::kNo);
  }
}

// --- The verb, as a user runs it ------------------------------------------

namespace {
Result runBatchdist(const std::string& args, const std::string& env = "") {
  return sh(env + " " + std::string(BATCHDIST_BIN) + " " + args);
}

void expectVerbError(const Result& r, const std::string& message) {
  EXPECT_TRUE(contains(r.out, "batchdist: error: ")) << r.out;
  batchdist::testsupport::expectCleanError(r, message);
}
}  // namespace

TEST(SlurmVerb, HelpNamesTheVerbAndItsOptions) {
  const auto r = runBatchdist("--help");
  EXPECT_EQ(r.code, 0);
  for (const char* what : {"batchdist slurm CONFIG.yaml --nodes N --gpus-per-node G",
                           "--gpus-per-node", "--tasks-per-node", "--partition", "--time",
                           "--signal-before", "--launcher", "--interface", "--submit"}) {
    EXPECT_TRUE(contains(r.out, what)) << what;
  }
}

TEST(SlurmVerb, BadOptions) {
  const auto out = tempDir("bad").string();
  const std::string base = "slurm " + kQuickstart + " --output " + out;
  expectVerbError(runBatchdist(base), "needs --gpus-per-node G");
  expectVerbError(runBatchdist(base + " --gpus-per-node 0"), "--tasks-per-node T");
  expectVerbError(runBatchdist(base + " --gpus-per-node 0 --tasks-per-node 0"),
                   "--tasks-per-node must be >= 1");
  expectVerbError(runBatchdist(base + " --gpus-per-node 0 --tasks-per-node 2 --time 2h"),
                   "--time '2h': not a Slurm time limit");
  expectVerbError(runBatchdist(base + " --gpus-per-node 0 --tasks-per-node 2 --time 1 "
                                    "--signal-before 90"),
                   "not shorter than --time 1 (60 s)");
  expectVerbError(runBatchdist(base + " --gpus-per-node 0 --tasks-per-node 2 --launcher ssh"),
                   "use auto, srun or mpirun");
  expectVerbError(runBatchdist(base + " --gpus-per-node nine"), "--gpus-per-node");
  // The config is checked for the job's world size before anything is written.
  expectVerbError(runBatchdist(base + " --gpus-per-node 8"), "train.device: cpu, but --gpus-per-node 8");
  expectVerbError(runBatchdist(base + " --gpus-per-node 0 --tasks-per-node 3"),
                   "world size 3: " + kQuickstart + ": batch.global=64 is not divisible");
  expectVerbError(runBatchdist(base + " --gpus-per-node 0 --tasks-per-node 2 --set batch.globl=3"),
                   "did you mean 'batch.global'");
  // Slurm options belong to the slurm verb.
  expectVerbError(runBatchdist(kQuickstart + " --nodes 2"), "--nodes is for 'batchdist slurm'");
  EXPECT_TRUE(fs::is_empty(out)) << "wrote something in " << out;
}

TEST(SlurmVerb, WritesAnExecutableScript) {
  const auto out = tempDir("write");
  const auto r = runBatchdist("slurm " + kQuickstart + " --output " + out.string() +
                           " --gpus-per-node 0 --tasks-per-node 2 --nodes 2 --time 10 --partition "
                           "debug --launcher mpirun --set train.epochs=2");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto script = out / "batchdist-quickstart.sbatch";
  EXPECT_TRUE(contains(r.out, "batchdist slurm: wrote " + script.string() + "\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "2 node(s) x 2 CPU rank(s) = world size 4")) << r.out;
  EXPECT_TRUE(contains(r.out, "submit with: sbatch " + script.string())) << r.out;
  ASSERT_TRUE(fs::exists(script));
  EXPECT_NE(fs::status(script).permissions() & fs::perms::owner_exec, fs::perms::none);
  std::stringstream text;
  text << std::ifstream(script).rdbuf();
  EXPECT_TRUE(contains(text.str(), "\n#SBATCH --nodes=2\n")) << text.str();
  EXPECT_TRUE(contains(text.str(), "\n#SBATCH --partition=debug\n")) << text.str();
  EXPECT_TRUE(contains(text.str(), "\n#SBATCH --signal=B:USR1@120\n")) << text.str();
  EXPECT_TRUE(contains(text.str(), " train " + kQuickstart + " --output \"$OUT\"")) << text.str();
  EXPECT_TRUE(contains(text.str(), "--set train.epochs=2")) << text.str();
  EXPECT_TRUE(contains(text.str(), std::string("\nmpirun -np \"$SLURM_NTASKS\" --map-by ppr:2:node")))
      << text.str();
  // The script names this very binary, by absolute path.
  EXPECT_TRUE(contains(text.str(), fs::canonical(BATCHDIST_BIN).string() + " train ")) << text.str();
  // Run outside an allocation, it says how to submit it instead of starting anything.
  const auto direct = sh("env -u SLURM_JOB_ID bash " + script.string());
  EXPECT_NE(direct.code, 0);
  EXPECT_TRUE(contains(direct.out, "submit this script with sbatch")) << direct.out;
}

TEST(SlurmVerb, SubmitPrintsTheJobIdOrSbatchsError) {
  const auto out = tempDir("submit");
  const auto bin = out / "fake-bin";
  fs::create_directories(bin);
  // Stand-ins for sbatch: the cluster's answer to `sbatch --parsable SCRIPT`.
  std::ofstream(bin / "sbatch") << "#!/bin/sh\n[ \"$1\" = --parsable ] && [ -f \"$2\" ] || exit 9\n"
                                   "echo '4242;cluster-a'\n";
  fs::permissions(bin / "sbatch", fs::perms::owner_all);
  const std::string path = "PATH=" + bin.string() + ":$PATH";
  const std::string args = "slurm " + kQuickstart + " --output " + out.string() +
                           " --gpus-per-node 0 --tasks-per-node 2 --launcher mpirun --submit";
  auto r = runBatchdist(args, path);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "batchdist slurm: submitted batch job 4242\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "log " + out.string() + "/batchdist-quickstart-4242.out, report " +
                                  out.string() + "/4242/report.json"))
      << r.out;

  std::ofstream(bin / "sbatch") << "#!/bin/sh\necho 'sbatch: error: invalid partition specified: "
                                   "gpu' >&2\nexit 1\n";
  r = runBatchdist(args, path);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "failed (exit 1): sbatch: error: invalid partition specified: gpu"))
      << r.out;
}

TEST(SlurmVerb, SrunWithoutPmixStopsWithOneClearMessage) {
  if (mpiSlurmPmiSupport() != SlurmPmi::kNo) {
    GTEST_SKIP() << "this MPI may speak Slurm's PMI; the real srun runs are in slurm_test.sh";
  }
  // What srun --mpi=none puts in each task's environment.
  const std::string env =
      "env SLURM_JOB_ID=7 SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=2 SLURM_NTASKS=2 ";
  const auto out = tempDir("srun").string();
  auto r = runBatchdist(kQuickstart + " --output " + out, env + "SLURM_PROCID=0");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "error: srun started this process as task 0 of a 2-task srun step"))
      << r.out;
  EXPECT_FALSE(contains(r.out, "*** An error occurred in MPI_Init")) << r.out;
  r = runBatchdist(kQuickstart + " --output " + out, env + "SLURM_PROCID=1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(r.out, "") << "task 1 repeats task 0's message";
  EXPECT_FALSE(fs::exists(fs::path(out) / "report.json"));
}

TEST(SlurmTemplate, MatchesTheGenerator) {
  // slurm/batchdist.sbatch is the hand-edited form of what the generator writes for a
  // GPU job with srun: same directives, same values where they are not placeholders.
  std::stringstream text;
  text << std::ifstream(std::string(BATCHDIST_SOURCE_DIR) + "/slurm/batchdist.sbatch").rdbuf();
  ASSERT_FALSE(text.str().empty());
  auto directives = [](const std::string& script) {
    std::map<std::string, std::string> out;
    std::istringstream in(script);
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      if (std::regex_match(line, m, std::regex("#SBATCH --([a-z-]+)=(.*)"))) out[m[1]] = m[2];
    }
    return out;
  };
  auto job = gpuJob();
  job.job_name = "batchdist";
  auto generated = directives(generate(job, kListWithPmix));
  generated.erase("chdir");  // the template runs where it is submitted
  const auto tmpl = directives(text.str());
  ASSERT_EQ(tmpl.size(), generated.size()) << text.str();
  for (const auto& [key, value] : generated) {
    ASSERT_TRUE(tmpl.count(key)) << "template lacks --" << key;
    if (key != "output" && key != "cpus-per-task") {
      EXPECT_EQ(tmpl.at(key), value) << "--" << key;
    }
  }
  EXPECT_TRUE(contains(text.str(), "\nsrun --mpi=pmix --kill-on-bad-exit=1 --gpu-bind=none "));
  expectValidBash(text.str());
}
