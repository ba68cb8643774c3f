// The real binary, as a user runs it: exit codes and messages for good and bad input.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "command.h"
#include "scratch_dir.h"

namespace {

using Result = batchdist::testsupport::CommandResult;
using batchdist::testsupport::expectCleanError;
using batchdist::testsupport::expectCleanFailure;
namespace fs = std::filesystem;

using batchdist::testsupport::scratchDir;

/// The binary runs in a working directory of this test process's own, so a run
/// without --output writes its default batchdist-out/ there, not in the build
/// tree beside the other tests' (Note [scratch dirs]).
Result run(const std::string& args, const std::string& prefix = "") {
  static const auto cwd = scratchDir("cli_cwd");
  return batchdist::testsupport::runCommand("cd '" + cwd.string() + "' && " + prefix +
                                            std::string(BATCHDIST_BIN) + " " + args);
}

std::string mpirun(int np) {
  return std::string(BATCHDIST_MPIRUN) + " " + BATCHDIST_MPI_FLAGS + " -np " + std::to_string(np) + " ";
}

/// `name` holding `text`, in a scratch directory of this test process's own.
std::string writeConfig(const std::string& name, const std::string& text) {
  static const auto dir = scratchDir("cli_test");
  const auto path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

const std::string kQuickstart = std::string(BATCHDIST_SOURCE_DIR) + "/configs/quickstart.yaml";

/// A new, empty directory of this test process's own (Note [scratch dirs]),
/// removed when it ends; `name` is only a prefix.
fs::path freshDir(const std::string& name) { return scratchDir(name); }

std::string readText(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// A tmpfs mounted on `dir` for the test's lifetime (root, or CAP_SYS_ADMIN).
/// The only way to make a directory unwritable or full that also stops root.
class TmpfsMount {
 public:
  TmpfsMount(const fs::path& dir, unsigned long flags, const std::string& options) : dir_(dir) {
    if (::mount("tmpfs", dir.c_str(), "tmpfs", flags, options.c_str()) == 0) {
      mounted_ = true;
    } else {
      why_not_ = std::string("cannot mount a tmpfs on ") + dir.string() + " (" +
                 std::strerror(errno) + "); this test needs root or CAP_SYS_ADMIN";
    }
  }
  ~TmpfsMount() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;
  bool mounted() const { return mounted_; }
  const std::string& whyNot() const { return why_not_; }

 private:
  fs::path dir_;
  bool mounted_ = false;
  std::string why_not_;
};

/// Set-up checks fail before training: nothing of the run is printed.
void expectNoTraining(const Result& r) {
  EXPECT_EQ(r.out.find("epoch 1/"), std::string::npos) << "trained before failing:\n" << r.out;
  EXPECT_EQ(r.out.find("model: "), std::string::npos) << "trained before failing:\n" << r.out;
}

// Asking for a GPU where there is none is bad input (exit 2, one message saying
// what this host has and what to set), in both legs of CI: a CPU-only build says
// so; a CUDA build on a machine without a GPU, or with CUDA_VISIBLE_DEVICES
// hiding them (as these runs do, so they pass on GPU machines too), says no GPU
// is visible.
#if BATCHDIST_TEST_CUDA_BUILD
const std::string kNoGpu = "no GPU is visible on host ";
#else
const std::string kNoGpu = "this batchdist is a CPU-only build (LibTorch ";
#endif
const std::string kHideGpus = "CUDA_VISIBLE_DEVICES= ";

}  // namespace

TEST(Cli, HelpAndVersion) {
  auto r = run("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("Usage:"), std::string::npos);
  EXPECT_NE(r.out.find("--set"), std::string::npos);
  EXPECT_NE(r.out.find("batchdist plan"), std::string::npos);
  r = run("--version");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("batchdist " BATCHDIST_VERSION " (torch "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gloo"), std::string::npos) << r.out;
#if BATCHDIST_TEST_CUDA_BUILD
  EXPECT_NE(r.out.find(", CUDA "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", NCCL "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("backends: gloo mpi nccl"), std::string::npos) << r.out;
#else
  EXPECT_NE(r.out.find(", CPU build, backends: gloo mpi)"), std::string::npos) << r.out;
#endif
}

TEST(Cli, BadCommandLines) {
  expectCleanError(run(""), "missing CONFIG.yaml");
  expectCleanError(run("--frobnicate x.yaml"), "unrecognised option '--frobnicate'");
  expectCleanError(run(kQuickstart + " extra.yaml"), "unexpected argument 'extra.yaml'");
  expectCleanError(run(kQuickstart + " --world 2"), "--world is for 'batchdist plan'");
}

TEST(Cli, MalformedYaml) {
  const auto path = writeConfig("malformed.yaml", "model:\n  name: [mlp\nbatch: {global: 64\n");
  expectCleanError(run(path + " -q"), "malformed YAML");
  EXPECT_NE(run(path).out.find(path + ":"), std::string::npos);
}

TEST(Cli, UnknownKeyWrongTypeNegativeBatch) {
  expectCleanError(run(writeConfig("unknown.yaml", "optim:\n  lr: 0.1\n  momentun: 0.9\n") + " -q"),
                   "optim.momentun: unknown key; did you mean 'optim.momentum'?");
  expectCleanError(run(writeConfig("type.yaml", "train:\n  epochs: many\n") + " -q"),
                   "train.epochs: expected an integer, got 'many'");
  expectCleanError(run(kQuickstart + " -q --set batch.global=-64"),
                   "--set batch.global: must be >= 1, got -64");
}

TEST(Cli, AdaptiveBatchIsPlannedAndTrained) {
  // Note [goodput]: `plan` checks the range and says where the data caps it.
  const auto planned = run("plan " + kQuickstart + " --world 2 --set batch.adapt=goodput");
  EXPECT_EQ(planned.code, 0) << planned.out;
  EXPECT_NE(planned.out.find("the global batch stays at or below 1438 / 8 = 179"), std::string::npos)
      << planned.out;
  // One rank, no accumulation: no noise scale, so G stays at G0 and the run ends
  // at the plan's steps (tests/adaptive.sh has the multi-rank runs).
  const auto out = freshDir("cli_adapt");
  const auto trained = run(kQuickstart + " --output " + out.string() +
                           " --set batch.adapt=goodput --set train.epochs=2");
  EXPECT_EQ(trained.code, 0) << trained.out;
  EXPECT_NE(trained.out.find("done: 44 steps, 44.0 at G0 = 64 (batch.adapt)"), std::string::npos)
      << trained.out;
  EXPECT_EQ(trained.out.find("adapt: step"), std::string::npos) << trained.out;
}

TEST(Cli, MissingFiles) {
  expectCleanError(run("/no/such/config.yaml"), "/no/such/config.yaml: cannot open config file");
  expectCleanError(run(kQuickstart + " -q --set data.name=csv --set data.path=/no/such.csv"),
                   "/no/such.csv: cannot open data file (data.path) (No such file or directory)");
}

TEST(Cli, CudaDeviceWithoutAGpuIsACleanError) {
  const auto r = run(kQuickstart + " -q --set train.device=cuda", kHideGpus);
  expectCleanError(r, "quickstart.yaml: train.device: cuda, but " + kNoGpu);
  EXPECT_NE(r.out.find("Set train.device: cpu (or auto) to train on the CPU"), std::string::npos) << r.out;
}

TEST(Cli, NcclWithoutAGpuListsWhatThisBuildHas) {
  const auto r = run(kQuickstart + " -q --set dist.backend=nccl", kHideGpus);
  expectCleanError(r, "quickstart.yaml: dist.backend: nccl, but " + kNoGpu);
  EXPECT_NE(r.out.find("this build has backends: auto, gloo"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Set dist.backend: gloo (or auto)"), std::string::npos) << r.out;
}

TEST(Cli, NoGpuUnderMpirunStopsEveryRankWithOneMessage) {
  // Refused before the rendezvous: every rank exits 2 together, no MPI_Abort.
  const auto r = run(kQuickstart + " -q --set train.device=cuda --set dist.backend=nccl",
                     kHideGpus + mpirun(2) + "-x CUDA_VISIBLE_DEVICES ");
  expectCleanError(r, "train.device: cuda and dist.backend: nccl, but " + kNoGpu);
  EXPECT_NE(r.out.find("[rank 0/2 host "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("MPI_ABORT"), std::string::npos) << r.out;
}

TEST(Cli, PlanPrintsTheArithmetic) {
  auto r = run("plan " + kQuickstart + " --world 4");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("world 4 x per-GPU batch 16 x accumulation 1 = global batch 64"),
            std::string::npos)
      << r.out;
  r = run("plan " + kQuickstart + " --world 2 --json --set batch.per_gpu=16 --set batch.last_batch=pad");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = YAML::Load(r.out);
  EXPECT_EQ(j["world_size"].as<int>(), 2);
  EXPECT_EQ(j["per_gpu_batch"].as<int>(), 16);
  EXPECT_EQ(j["accum_steps"].as<int>(), 2);
  EXPECT_EQ(j["global_batch"].as<int>(), 64);
  EXPECT_EQ(j["steps_per_epoch"].as<int>(), 23);    // ceil(1438 / 64)
  EXPECT_EQ(j["samples_padded"].as<int>(), 34);     // 23 * 64 - 1438
  EXPECT_EQ(j["samples_dropped"].as<int>(), 0);
  EXPECT_NEAR(j["lr"].as<double>(), 0.05, 1e-12);
  EXPECT_EQ(j["warmup_steps"].as<int>(), 23);
  EXPECT_EQ(j["ranks"].size(), 2u);
  EXPECT_EQ(j["ranks"][1]["samples_per_epoch"].as<int>(), 23 * 32);
}

TEST(Cli, PlanJsonErrorIsJsonToo) {
  const auto r = run("plan " + kQuickstart + " --world 3 --json --set batch.global=100 --set batch.per_gpu=32 2>/dev/null");
  EXPECT_EQ(r.code, 2);
  const auto j = YAML::Load(r.out);
  EXPECT_NE(j["error"].as<std::string>().find("use 96 or 192"), std::string::npos) << r.out;
}

TEST(Cli, BadConfigUnderMpirunStopsEveryRankWithOneMessage) {
  const auto r = run(kQuickstart + " -q --set batch.last_batch=keep", mpirun(2));
  EXPECT_NE(r.code, 0);
  const std::string msg = "batch.last_batch: keep splits the short last batch";
  const auto at = r.out.find(msg);
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(msg, at + 1), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 0/2 host "), std::string::npos) << r.out;
}

TEST(Cli, SingletonRunWritesReportAndModel) {
  const auto out = freshDir("cli_single");
  const auto r = run(kQuickstart + " -q --set train.epochs=2 --output " + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto rep = YAML::LoadFile((out / "report.json").string());
  EXPECT_EQ(rep["world_size"].as<int>(), 1);
  EXPECT_EQ(rep["epochs"].as<int>(), 2);
  EXPECT_EQ(rep["steps"].as<int>(), 44);
  EXPECT_GT(rep["eval_accuracy"].as<double>(), 0.8);
  EXPECT_EQ(rep["config"]["train"]["epochs"].as<int>(), 2);
  for (const char* key : {"backend", "device", "per_gpu_batch", "accum_steps", "global_batch", "lr",
                          "samples_per_s", "train_loss", "eval_loss", "wall_s"}) {
    EXPECT_TRUE(rep[key].IsDefined()) << key;
  }
  EXPECT_TRUE(std::filesystem::exists(out / "model.pt"));
  EXPECT_GT(rep["validation_samples"].as<int>(), 0);
  // Note [host blas]: a CPU run names the BLAS it found (empty only when none is exported).
  EXPECT_TRUE(rep["cpu_blas"].IsDefined());
}

// A run shorter than report.sample_s took no system sample: report.html showed a
// host heading with nothing under it, and the console said nothing. Both say so.
TEST(Cli, ARunShorterThanTheSamplePeriodSaysItTookNoSample) {
  const auto out = freshDir("cli_no_sample");
  const auto r = run(kQuickstart + " --set train.epochs=1 --set train.progress=off "
                     "--set report.sample_s=3600 --output " + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("system: no sample was taken: training ended before the first one (every "
                       "3600 s, report.sample_s)"),
            std::string::npos)
      << r.out;
  const auto page = readText(out / "report.html");
  EXPECT_NE(page.find("No sample was taken: training ended before the first one (every 3600 s"),
            std::string::npos);
}

TEST(Cli, WithoutAValidationSetNoAccuracyIsClaimed) {
  const auto out = freshDir("cli_noval");
  // Two epochs, not the quickstart's 20: 2 s alone, but under ctest -j8 on 2 cores
  // (issue 33's repeat run) the 20 took 93-174 s of the 300 s limit.
  const auto r = run(kQuickstart + " --set data.val_fraction=0 --set train.epochs=2 --output " +
                     out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("eval_acc"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("eval accuracy"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(no validation set)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("steps, no validation set, "), std::string::npos) << r.out;
  const auto rep = YAML::LoadFile((out / "report.json").string());
  EXPECT_EQ(rep["validation_samples"].as<int>(), 0);
  EXPECT_NE(readText(out / "report.html").find("no validation set"), std::string::npos);
}

TEST(Cli, SearchCacheHitMissAndResearch) {
  const auto out = freshDir("cli_search");
  const std::string base = "search " + std::string(BATCHDIST_SOURCE_DIR) +
                           "/configs/search-cpu.yaml --output " + out.string() +
                           " --set search.max=32 --set search.timed_steps=1 --set search.warmup_steps=1"
                           " --set search.min_time_s=0 --set search.max_time_s=0.2";
  auto cachedFlag = [&] {
    const auto path = out / "search.json";
    if (!std::filesystem::exists(path)) {
      std::string listing;
      for (const auto& e : std::filesystem::directory_iterator(out)) listing += " " + e.path().filename().string();
      ADD_FAILURE() << path << " missing; the directory holds:" << listing;
      return false;
    }
    return YAML::LoadFile(path.string())["cached"].as<bool>();
  };
  auto r = run(base);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("<- chosen"), std::string::npos) << r.out;
  EXPECT_FALSE(cachedFlag());
  EXPECT_TRUE(std::filesystem::exists(out / "search.svg"));
  EXPECT_TRUE(std::filesystem::exists(out / "search_cache.json"));

  r = run(base);  // same key: hit
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("cached result"), std::string::npos) << r.out;
  EXPECT_TRUE(cachedFlag());

  r = run(base + " --set model.channels=[8,16]");  // model changed: miss
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("cached result"), std::string::npos) << r.out;
  EXPECT_FALSE(cachedFlag());

  r = run(base + " --set model.channels=[8,16] --research");  // forced
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("cached result"), std::string::npos) << r.out;
  EXPECT_FALSE(cachedFlag());
}

TEST(Cli, RanksWithDifferentConfigsAreToldWhatDiffers) {
  const std::string args = kQuickstart + " -q --output " + freshDir("cli_mismatch").string();
  std::string flags = BATCHDIST_MPI_FLAGS;
  const auto r = run(args + " : " + flags + " -np 1 " + BATCHDIST_BIN + " " + args +
                         " --set model.hidden=[32]",
                     mpirun(1));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[rank 1/2 host "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("config differs from rank 0's: model.hidden = [32] here, [128,64] on rank 0"),
            std::string::npos)
      << r.out;
}

TEST(Cli, RanksThatRunDifferentVerbsOrVersionsAreRefusedBeforeAnyCollective) {
  // Note [same command]: `train : search` ended in MPI_ERR_TRUNCATE, a corrupted
  // heap and SIGABRT. Refused by the first collective, whatever the backend.
  const std::string flags = BATCHDIST_MPI_FLAGS;
  const std::string out = freshDir("cli_two_verbs").string();
  for (const std::string backend : {"mpi", "gloo"}) {
    SCOPED_TRACE(backend);
    const std::string args = kQuickstart + " -q --output " + out + " --set dist.backend=" + backend;
    auto r = run("train " + args + " : " + flags + " -np 1 " + BATCHDIST_BIN + " search " + args,
                 mpirun(1));
    expectCleanError(r, "[rank 0/2 host ");
    expectCleanError(r, "error: the ranks of this job run different commands: rank 1 runs "
                        "`batchdist search` of batchdist " BATCHDIST_VERSION ", rank 0 runs "
                        "`batchdist train` of batchdist " BATCHDIST_VERSION ". Every rank must "
                        "run the same verb of the same batchdist version");
    expectNoTraining(r);
    for (const char* mpi_crash : {"MPI_ERR", "MPI_ABORT", "free()", "corrupted", "backtrace"}) {
      EXPECT_EQ(r.out.find(mpi_crash), std::string::npos) << mpi_crash << " in:\n" << r.out;
    }
  }
  // Three ranks, the last two of another build: the lowest one is named.
  const std::string args = kQuickstart + " -q --output " + out;
  const auto r = run(args + " : " + flags + " -np 2 -x BATCHDIST_FAULT_VERSION=0.0.1-other " +
                         BATCHDIST_BIN + " " + args,
                     mpirun(1));
  expectCleanError(r, "rank 1 runs `batchdist train` of batchdist 0.0.1-other, rank 0 runs "
                      "`batchdist train` of batchdist " BATCHDIST_VERSION
                      " (1 more rank(s) differ from rank 0)");
  // `data` against `train` too.
  expectCleanError(run("data " + args + " : " + flags + " -np 1 " + BATCHDIST_BIN + " " + args,
                       mpirun(1)),
                   "rank 1 runs `batchdist train` of batchdist " BATCHDIST_VERSION
                   ", rank 0 runs `batchdist data`");
}

TEST(Cli, Resnet18Cifar10ConfigPlansAgainstCifarFiles) {
  // A miniature CIFAR-10 directory in the real binary layout (10 images a file).
  const auto dir = freshDir("cli_cifar");
  std::string records;
  for (int i = 0; i < 10; ++i) {
    records.push_back(static_cast<char>(i));
    records.append(3072, static_cast<char>(i * 7));
  }
  for (const char* f : {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                        "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"}) {
    std::ofstream(dir / f, std::ios::binary) << records;
  }
  const std::string cfg = std::string(BATCHDIST_SOURCE_DIR) + "/configs/resnet18-cifar10.yaml";
  auto r = run("plan " + cfg + " --world 2 --json --set data.path=" + dir.string() +
               " --set batch.per_gpu=5 --set batch.global=10");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = YAML::Load(r.out);
  EXPECT_EQ(j["dataset_size"].as<int>(), 50);
  EXPECT_EQ(j["steps_per_epoch"].as<int>(), 5);
  // Without the files: a clear error naming the file it looked for.
  expectCleanError(run("plan " + cfg + " --world 2"),
                   "cifar-10-batches-bin/data_batch_1.bin: cannot open data file (data.path) (No such file "
                   "or directory)");
}

// --- Bugs found by new users (each test fails on the code before 1958dcc) ---

TEST(Cli, AMappingAsAKeyIsACleanError) {
  // `plan` used to die of an uncaught YAML::TypedBadConversion, `train` with exit 1.
  const auto top = writeConfig("map_key_top.yaml", "? [a, b]\n: 1\n");
  expectCleanError(run("plan " + top + " --world 2"),
                   top + ":1: a key must be a plain name, got a list (in top level)");
  expectCleanError(run(top + " -q"), "a key must be a plain name");
  const auto inner = writeConfig("map_key_inner.yaml", "batch:\n  ? [a, b]\n  : 1\n");
  expectCleanError(run("plan " + inner + " --world 2"),
                   inner + ":2: batch: a key must be a plain name, got a list (in batch)");
  expectCleanError(run(inner + " -q"), "a key must be a plain name");
}

TEST(Cli, DuplicateKeysSectionsAndDocumentsAreRefused) {
  const auto keys = writeConfig("dup_keys.yaml", "batch: {global: 64, global: 128}\n");
  expectCleanError(run("plan " + keys), "batch.global: 'global' is given twice (first on line 1)");
  const auto sections = writeConfig("dup_sections.yaml",
                                    "batch:\n  global: 64\ntrain:\n  epochs: 1\nbatch:\n  global: 128\n");
  expectCleanError(run(sections + " -q"), sections + ":5: batch: 'batch' is given twice (first on line 1)");
  const auto docs = writeConfig("two_docs.yaml", "batch: {global: 64}\n---\nbatch: {global: 128}\n");
  expectCleanError(run(docs + " -q"), docs + ":2: holds 2 YAML documents");
}

TEST(Cli, ADirectoryIsNotAConfig) {
  // Trained with the defaults and exited 0.
  const auto dir = freshDir("cli_config_dir");
  expectCleanError(run(dir.string() + " -q"), dir.string() + ": is a directory, not a config file");
  expectCleanError(run("plan " + dir.string()), "is a directory");
}

TEST(Cli, DevZeroIsNoConfig) {
  // std::bad_alloc / "terminate called" while reading forever; then 4 MiB read.
  const std::string refused = "/dev/zero: config file is a character device, not a regular file";
  expectCleanError(run("/dev/zero -q"), refused);
  expectCleanError(run("plan /dev/zero"), refused);
}

// Note [input files are regular files]: /dev/zero was read up to 1 GiB (2.2 GB
// resident per rank) before it was refused, and a FIFO without a writer blocked
// every rank in open(). Both are refused before a byte is read; ctest runs this
// test alone as well, with a short TIMEOUT (tests/CMakeLists.txt).
TEST(Cli, DataThatIsADeviceOrPipeIsRefusedBeforeReading) {
  auto r = run(kQuickstart + " -q --set data.name=csv --set data.path=/dev/zero");
  expectCleanError(r, "/dev/zero: data file (data.path) is a character device, not a regular "
                      "file; every rank reads a data file whole");
  expectNoTraining(r);
  expectCleanError(run("plan " + kQuickstart + " --set data.name=csv --set data.path=/dev/zero"),
                   "/dev/zero: data file (data.path) is a character device");
  const auto dir = freshDir("cli_fifo");
  const auto fifo = (dir / "rows.csv").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  r = run(kQuickstart + " -q --set data.name=csv --set data.path=" + fifo, mpirun(2));
  expectCleanError(r, fifo + ": data file (data.path) is a pipe (FIFO), not a regular file");
  expectNoTraining(r);
  // An image list on /dev/zero was one endless line read into memory.
  expectCleanError(run(kQuickstart + " -q --set data.name=image_folder --set data.list=/dev/zero"),
                   "data.list: /dev/zero is a character device, not a regular file; give a "
                   "text file of \"relative/path label\" lines");
}

// Note [input files are regular files]: data.name: tokens with data.path a FIFO
// hung every rank in open() until killed, data.path's check notwithstanding (it
// was csv's alone); so did a .npy, a tar shard, model.path, the config file
// itself and a host file. Each is refused by what it is before a byte is read, a
// symlink to one and a socket too; ctest runs this test alone with a short
// TIMEOUT as well (tests/CMakeLists.txt).
TEST(Cli, EveryFileNamedThatIsAPipeIsRefusedBeforeReading) {
  const auto dir = freshDir("cli_pipes");
  const auto fifo = [&](const std::string& name) {
    const auto p = (dir / name).string();
    fs::create_directories(fs::path(p).parent_path());
    EXPECT_EQ(::mkfifo(p.c_str(), 0600), 0) << p << ": " << std::strerror(errno);
    return p;
  };
  const std::string pipe = ": is a pipe (FIFO), not a regular file";
  const std::string gpt = std::string(BATCHDIST_SOURCE_DIR) + "/configs/gpt-tiny.yaml";
  const auto bin = fifo("x.bin");
  auto r = run(gpt + " -q --set data.path=" + bin, mpirun(2));
  expectCleanError(r, bin + pipe + " (check data.path; expected token ids");
  expectNoTraining(r);
  const auto link = (dir / "link.bin").string();
  fs::create_symlink(bin, link);
  expectCleanError(run("plan " + gpt + " --set data.path=" + link), link + pipe);
  const auto x = fifo("npy/x.npy");
  expectCleanError(run(kQuickstart + " -q --set data.name=npy --set data.path=" + (dir / "npy").string()),
                   x + pipe + " (check data.path; expected a .npy file");
  const auto tar = fifo("shards/train-000000.tar");
  expectCleanError(run(kQuickstart + " -q --set data.name=webdataset --set data.path=" + tar),
                   tar + pipe + " (expected a .tar shard)");
  expectCleanError(run(kQuickstart + " -q --set data.name=webdataset --set data.path=" + (dir / "shards").string()),
                   tar + pipe + " (expected a .tar shard)");
  const auto pt = fifo("model.pt");
  expectCleanError(run(std::string(BATCHDIST_SOURCE_DIR) + "/configs/torchscript-digits.yaml -q "
                       "--set model.path=" + pt),
                   "model.path: '" + pt + "' is a pipe (FIFO), not a regular file");
  const auto yaml = fifo("config.yaml");
  r = run(yaml + " -q", mpirun(2));
  expectCleanError(r, yaml + ": config file is a pipe (FIFO), not a regular file; every rank reads the config");
  expectNoTraining(r);
  // --resume PATH: a FIFO is no checkpoint ("no such checkpoint" before); one
  // whose manifest.json is a FIFO waited in open().
  const auto ckpt = fifo("ckpt");
  expectCleanError(run(kQuickstart + " -q --resume " + ckpt),
                   "--resume: " + ckpt + ": is a pipe (FIFO), not a checkpoint (a step-* directory");
  const auto manifest = fifo("step-1/manifest.json");
  expectCleanError(run(kQuickstart + " -q --resume " + (dir / "step-1").string()),
                   (dir / "step-1").string() + " cannot be loaded: " + manifest +
                       ": manifest is a pipe (FIFO), not a regular file");
  const auto hosts = fifo("hosts");
  expectCleanError(run("elastic " + kQuickstart + " --hosts " + hosts),
                   hosts + ": host file (--hosts) is a pipe (FIFO), not a regular file; it is read again");
}

TEST(Cli, TooFewRowsNameTheDataFile) {
  // "data.val_fraction: 0 leaves 1 of 1 samples for training": which file?
  const auto csv = writeConfig("one_row.csv", "0.5,0.25,1\n");
  auto r = run(kQuickstart + " -q --set data.name=csv --set data.path=" + csv +
               " --set data.val_fraction=0");
  expectCleanError(r, csv + ": holds 1 sample; training needs at least 2: add samples");
  expectNoTraining(r);
  r = run("plan " + kQuickstart + " --set data.name=csv --set data.path=" + csv +
          " --set data.val_fraction=0.5");
  expectCleanError(r, csv + ": holds 1 sample, and data.val_fraction: 0.5 keeps 1 for validation; "
                          "training needs at least 2");
  const auto three = writeConfig("three_rows.csv", "0.5,0.25,1\n0.1,0.2,0\n0.3,0.3,1\n");
  expectCleanError(run(kQuickstart + " -q --set data.name=csv --set data.path=" + three +
                       " --set data.val_fraction=0.5"),
                   three + ": holds 3 samples, and data.val_fraction: 0.5 keeps 2 for validation; "
                           "training needs at least 2: add samples, or lower data.val_fraction");
}

TEST(Cli, AnUnknownYamlDirectiveIsRefused) {
  // Note [YAML directives]: "% oops" on the first line was dropped without a word.
  const auto path = writeConfig("directive.yaml", "% oops\nbatch: {global: 64}\n");
  const std::string message = path + ":1: '% oops' is not a YAML directive (YAML has only %YAML "
                                     "and %TAG); a comment starts with '#'";
  auto r = run(path + " -q", mpirun(2));
  expectCleanError(r, message);
  expectNoTraining(r);
  expectCleanError(run("plan " + path), message);
}

TEST(Cli, UnwritableOutputIsRefusedBeforeTraining) {
  // A read-only output directory used to fail after training, with "File
  // .../model.pt.tmp cannot be opened." and no cause. Permissions do not stop
  // root, so as root the directory is a read-only tmpfs.
  const auto dir = freshDir("cli_readonly");
  std::optional<TmpfsMount> ro;
  std::string cause = "Permission denied";
  if (geteuid() == 0) {
    ro.emplace(dir, MS_RDONLY, "size=64k");
    if (!ro->mounted()) GTEST_SKIP() << ro->whyNot();
    cause = "Read-only file system";
  } else {
    fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                             fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  }
  for (const auto& out : {dir, dir / "sub"}) {
    SCOPED_TRACE(out.string());
    const auto r = run(kQuickstart + " --set train.epochs=1 --output " + out.string());
    expectCleanFailure(r, 1, "cannot write the results (--output) to " + out.string() + ": " + cause);
    expectNoTraining(r);
  }
  if (geteuid() != 0) fs::permissions(dir, fs::perms::owner_all);
}

TEST(Cli, OutputOrReportThatCannotBeWrittenIsRefusedBeforeTraining) {
  // These used to fail after training, and the trained model was lost.
  const auto dir = freshDir("cli_outputs");
  const auto file = dir / "a_file";
  std::ofstream(file) << "not a directory\n";
  auto r = run(kQuickstart + " --set train.epochs=1 --output " + file.string());
  expectCleanFailure(r, 1, "cannot write the results (--output) to " + file.string() + ": ");
  expectNoTraining(r);
  r = run(kQuickstart + " --set train.epochs=1 --output " + (dir / "out").string() + " --report " +
          (file / "report.json").string());
  expectCleanFailure(r, 1, "cannot write the report (--report) to " + file.string() + ": ");
  expectNoTraining(r);
  r = run(kQuickstart + " --set train.epochs=1 --output " + (dir / "out").string() + " --report " +
          dir.string());
  expectCleanFailure(r, 1, "cannot write the report (--report) to " + dir.string() +
                               ": it is a directory");
  expectNoTraining(r);
  EXPECT_EQ(readText(file), "not a directory\n");
}

TEST(Cli, AFullDiskWhileSavingTheModelIsACleanErrorAndKeepsEarlierFiles) {
  // model.pt used to be written by torch::save: a full disk ended the job with
  // "terminate called after throwing c10::Error" (exit 134).
  const auto dir = freshDir("cli_full_disk");
  TmpfsMount full(dir, 0, "size=64k");
  if (!full.mounted()) GTEST_SKIP() << full.whyNot();
  std::ofstream(dir / "report.json") << "{\"earlier\": true}\n";
  std::ofstream(dir / "search.json") << "{\"earlier\": \"search\"}\n";
  // About 300k parameters: model.pt (~1.2 MB) cannot fit in 64 KB.
  const auto r = run(kQuickstart + " -q --set model.hidden=[512,512] --set train.max_steps=2 "
                                   "--set train.epochs=1 --output " + dir.string());
  expectCleanFailure(r, 1, "cannot write " + (dir / "model.pt").string() + ": No space left on device");
  EXPECT_EQ(readText(dir / "report.json"), "{\"earlier\": true}\n");
  EXPECT_EQ(readText(dir / "search.json"), "{\"earlier\": \"search\"}\n");
  EXPECT_FALSE(fs::exists(dir / "model.pt"));
  for (const auto& e : fs::directory_iterator(dir)) {  // no partial file left filling the disk
    EXPECT_NE(e.path().filename().string().rfind("model.pt.tmp", 0), 0u) << e.path();
  }
}

TEST(Cli, HugeBatchesOverflowCleanly) {
  // per-GPU 2^62 x 4 ranks wrapped to 0: SIGFPE.
  expectCleanError(run("plan " + kQuickstart + " --world 4 --set batch.per_gpu=4611686018427387904"),
                   "batch.per_gpu x world size overflows (4611686018427387904 x 4)");
  expectCleanError(run("plan " + kQuickstart +
                       " --world 1 --set batch.global=null --set batch.per_gpu=4611686018427387904"
                       " --set batch.accum=4"),
                   "batch.per_gpu x batch.accum overflows");
  // More padding than data (1438 training samples, global batch 4096).
  expectCleanError(run("plan " + kQuickstart + " --world 2 --set batch.global=4096 "
                                               "--set batch.last_batch=pad"),
                   "would add 2658 padding samples to the 1438 of the training set each epoch "
                   "(more padding than data)");
}

TEST(Cli, BatchNormMinimumIsCheckedAtLoad) {
  expectCleanError(run(kQuickstart + " -q --set batch.min_per_gpu=1"),
                   "--set batch.min_per_gpu: 1 is too small for a model with BatchNorm");
  expectCleanError(run("plan " + kQuickstart + " --world 2 --set batch.global=null --set batch.per_gpu=1"),
                   "--set batch.per_gpu: 1 is too small for a model with BatchNorm");
}

TEST(Cli, SearchWithGlobalAndAccumFixedIsRefusedAtLoad) {
  const std::string cfg = std::string(BATCHDIST_SOURCE_DIR) + "/configs/search-cpu.yaml";
  const auto r = run(cfg + " --set batch.global=64 --set batch.accum=2");
  expectCleanError(r, "auto with both batch.global (64) and batch.accum (2) set leaves nothing to search");
  expectNoTraining(r);
  EXPECT_EQ(r.out.find("batch search:"), std::string::npos) << r.out;
}

TEST(Cli, UnknownSectionFromSetIsBlamedOnTheSet) {
  const auto r = run(kQuickstart + " -q --set foo.x=1");
  expectCleanError(r, "--set foo: unknown section 'foo'");
  EXPECT_EQ(r.out.find(kQuickstart + ": foo"), std::string::npos) << r.out;
}

TEST(Cli, PlanJsonErrorWithBytesThatAreNotUtf8IsStillJson) {
  // The error JSON quoted the bad key: nlohmann threw type_error 316 inside the
  // catch block, "terminate called". Found by the config fuzzer.
  const auto path = writeConfig("latin1_key.yaml", "batch:\n  gl\xF6" "bal: 64\n");
  const auto r = run("plan " + path + " --json 2>/dev/null");
  EXPECT_EQ(r.code, 2) << r.out;
  const auto j = YAML::Load(r.out);
  EXPECT_NE(j["error"].as<std::string>().find("unknown key"), std::string::npos) << r.out;
  const auto text = writeConfig("latin1_value.yaml", "data:\n  name: csv\n  path: donn\xE9" "es.csv\n");
  expectCleanError(run(text + " -q"), "data.path: is not valid UTF-8 (byte 0xE9 at offset 4");
}

TEST(Cli, AnOutputPathThatIsNotUtf8StillGetsItsReport) {
  // report.json quotes --output (model_path); nlohmann refused to dump the
  // Latin-1 name after training, and the report was lost (exit 1).
  const auto dir = freshDir("cli_latin1_\xE9");
  const auto r = run(kQuickstart + " -q --set train.max_steps=2 --set train.epochs=1 --output " +
                     dir.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto report = nlohmann::json::parse(readText(dir / "report.json"));
  EXPECT_EQ(report["steps"].get<int>(), 2);
  EXPECT_NE(report["model_path"].get<std::string>().find("latin1_\xEF\xBF\xBD"), std::string::npos)
      << report["model_path"];  // the stray byte as U+FFFD
}

TEST(Cli, DamagedSearchCacheIsNamedAndSearchedAgain) {
  // A cached entry with chosen 0 used to reach the plan, whose error named the
  // config file; now the cache file is named in a warning and the search reruns.
  const auto dir = freshDir("cli_damaged_cache");
  const auto cache = (dir / "cache.json").string();
  const std::string cfg = std::string(BATCHDIST_SOURCE_DIR) + "/configs/search-cpu.yaml";
  const std::string search = " --set search.max=16 --set search.timed_steps=1 --set search.warmup_steps=1"
                             " --set search.min_time_s=0 --set search.max_time_s=0.2"
                             " --set search.cache=" + cache + " --output " + (dir / "out").string();
  auto r = run("search " + cfg + search);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(readText(cache));
  ASSERT_GT(j["result"]["chosen"].get<int>(), 0);
  j["result"]["chosen"] = 0;
  std::ofstream(cache) << j.dump(2);
  r = run(cfg + search + " --set train.max_steps=2 --set train.epochs=1");
  EXPECT_EQ(r.code, 0) << r.out;
  const std::string warning = "batchdist: warning: ignoring the search cache: " + cache +
                              ": damaged entry: chosen per-GPU batch 0 is not positive; searching again";
  EXPECT_NE(r.out.find(warning), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("cached result"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("search-cpu.yaml: batch.per_gpu"), std::string::npos) << r.out;
  // The search ran again and rewrote the entry.
  EXPECT_GT(nlohmann::json::parse(readText(cache))["result"]["chosen"].get<int>(), 0);
}

// The input pipeline's command line and bad inputs (issue: real input data).
TEST(Cli, DataVerbOptionsAndBadSources) {
  expectCleanError(run(kQuickstart + " --seconds 3"), "--seconds is for 'batchdist data'");
  expectCleanError(run("data " + kQuickstart + " --seconds 0"), "--seconds must be in (0, 86400], got 0");
  expectCleanError(run(kQuickstart + " --json"), "--json is for 'batchdist plan' and 'batchdist data'");
  const auto dir = freshDir("cli_data");
  // No train/ under the folder; an image_folder without a path; crop bounds reversed.
  expectCleanError(run(kQuickstart + " -q --set data.name=image_folder --set data.path=" + dir.string()),
                   "has no train/ folder");
  expectCleanError(run(kQuickstart + " -q --set data.name=image_folder"),
                   "data.path: data.name: image_folder needs the folder ROOT");
  expectCleanError(run(kQuickstart + " -q --set data.name=image_folder --set data.path=x "
                                     "--set data.crop_scale=[1.0,0.5]"),
                   "data.crop_scale: expected [low, high] with low <= high");
  expectCleanError(run(kQuickstart + " -q --set data.name=npy --set data.path=" + dir.string()),
                   "x.npy");
  expectCleanError(run(kQuickstart + " -q --set data.name=webdataset --set data.path=" +
                       dir.string() + "/train-{000000..000003}.tar"),
                   "train-000000.tar");
  expectCleanError(run(kQuickstart + " -q --set data.on_error=ignore"),
                   "data.on_error: 'ignore' is not one of skip | fail");
}

// batchdist elastic (Note [elastic supervisor]): its command line and host list
// refused with the reason, and a job on this host alone run to the end with the
// attempt in the report (the lost hosts: tests/cluster/elastic_netns.sh).
TEST(Elastic, BadCommandLinesAndHostLists) {
  expectCleanError(run("elastic " + kQuickstart), "batchdist elastic needs the hosts: --hosts FILE or --hosts-command CMD");
  expectCleanError(run(kQuickstart + " --hosts h.txt"), "--hosts is for 'batchdist elastic'");
  expectCleanError(run("elastic " + kQuickstart + " --hosts h --min-ranks 4 --max-ranks 2"),
                   "--max-ranks 2 is below --min-ranks 4");
  const auto dir = scratchDir("elastic_cli");
  const auto bad = (dir / "bad_hosts").string();
  std::ofstream(bad) << "localhost slots=2\nnode2 slots=two\n";
  expectCleanError(run("elastic " + kQuickstart + " --hosts " + bad),
                   "--hosts " + bad + ":2: slots=two: expected a whole number >= 1");
  expectCleanError(run("elastic " + kQuickstart + " --hosts " + (dir / "missing").string()),
                   (dir / "missing").string() + ": cannot open host file (--hosts) (No such file or directory)");
  const auto ok = (dir / "hosts").string();
  std::ofstream(ok) << "localhost slots=2\n";
  expectCleanError(run("elastic " + kQuickstart + " --hosts " + ok +
                       " --set elastic.heartbeat_s=2 --set elastic.heartbeat_timeout_s=3"),
                   "elastic.heartbeat_timeout_s: 3 is less than two heartbeats");
}

// A host list with no host said "the host list names no host": which list, and
// why (a directory read as an empty file)?
TEST(Elastic, AHostListWithoutHostsIsNamed) {
  const auto dir = scratchDir("elastic_no_host");
  const auto run_with = [&](const std::string& hosts) {
    return run("elastic " + kQuickstart + " " + hosts + " --output " + (dir / "out").string() + " -q");
  };
  const auto empty = (dir / "empty").string();
  std::ofstream(empty) << "";
  expectCleanError(run_with("--hosts " + empty),
                   "--hosts " + empty + " names no host (it is empty, or holds only comments): list "
                   "one 'HOST [slots=N]' per line");
  const auto comments = (dir / "comments").string();
  std::ofstream(comments) << "# node1 slots=2\n   \n# node2\n";
  expectCleanError(run_with("--hosts " + comments), "--hosts " + comments + " names no host");
  expectCleanError(run_with("--hosts " + dir.string()),
                   dir.string() + ": is a directory, not a host file (--hosts)");
  expectCleanError(run_with("--hosts-command true"), "--hosts-command 'true' printed no host");
  expectCleanError(run_with("--hosts-command 'echo oops >&2; exit 3'"),
                   "--hosts-command 'echo oops >&2; exit 3' failed (exit status 3): oops");
}

// Note [launcher checked first]: a launcher that cannot run, or options it refuses
// on every host, made every host "lost": the supervisor waited elastic.wait_s
// (here 5 s, then exit 1 "gave up") for hosts that were there all along.
TEST(Elastic, ALauncherThatCannotStartAJobIsBadInputAtOnce) {
  const auto dir = scratchDir("elastic_launcher");
  const auto hosts = (dir / "hosts").string();
  std::ofstream(hosts) << "localhost slots=2\n";
  const std::string base = "elastic " + kQuickstart + " --hosts " + hosts + " --output " +
                           (dir / "out").string() + " -q --set elastic.wait_s=5";
  const std::string fix = "; give the path of Open MPI's mpirun";
  expectCleanError(run(base + " --mpirun /no-such-mpirun"),
                   "--mpirun /no-such-mpirun: No such file or directory" + fix);
  expectCleanError(run(base + " --mpirun no-such-mpirun"), "--mpirun no-such-mpirun: not found on PATH (");
  expectCleanError(run(base + " --mpirun " + dir.string()), "--mpirun " + dir.string() + ": is a directory" + fix);
  expectCleanError(run(base + " --mpirun " + hosts), "--mpirun " + hosts + ": is not executable (");
  expectCleanError(run(base + " --mpirun /bin/false"),
                   "--mpirun /bin/false: '/bin/false --version' exited with status 1");
  // One that runs, answers every probe and exits 0 without starting a rank: the
  // job "finished" (exit 0, no report).
  expectCleanError(run(base + " --mpirun echo"),
                   "--mpirun echo exited 0, but no rank of the job started (no heartbeat, no "
                   "report.json): give the path of Open MPI's mpirun");
  const std::string args = BATCHDIST_MPI_FLAGS " --no-such-option";
  const auto r = run(base + " --mpirun " BATCHDIST_MPIRUN " --mpirun-args '" + args + "'");
  expectCleanError(r, "--mpirun-args '" + args + "': mpirun refuses to start with them on every host "
                      "(localhost: could not start a process there (mpirun exited with status 1: ");
  EXPECT_NE(r.out.find("unknown option \"--no-such-option\")), and starts a process on localhost "
                       "without them: correct them, or leave them out"),
            std::string::npos)
      << r.out;
}

TEST(Elastic, AJobOnOneHostRunsToTheEndWithItsAttemptInTheReport) {
  const auto dir = scratchDir("elastic_local");
  std::ofstream(dir / "hosts") << "localhost slots=2\n";
  const auto r = run("elastic " + kQuickstart + " --hosts " + (dir / "hosts").string() +
                     " --mpirun " BATCHDIST_MPIRUN " --mpirun-args '" BATCHDIST_MPI_FLAGS "' --output " +
                     (dir / "out").string() + " --set train.epochs=2 --set train.threads=1 -q");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("elastic: attempt 1: 2 rank(s) on 1 host(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("elastic: finished after 1 attempt(s)"), std::string::npos) << r.out;
  std::ifstream in(dir / "out" / "report.json");
  const auto report = nlohmann::json::parse(in);
  ASSERT_TRUE(report.contains("elastic")) << report.dump();
  const auto& a = report["elastic"]["attempts"];
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0]["world"], 2);
  EXPECT_EQ(a[0]["cause"], "finished");
  EXPECT_EQ(a[0]["last_step"], report["steps"]);
  EXPECT_EQ(a[0]["start_step"], 0);
  EXPECT_EQ(report["elastic"]["exit_code"], 0);
}

// Note [checkpoint interval]: every_steps: auto checkpoints after the first step,
// then every k = ceil(w / (1 % of t)) steps, w what the step waited, t the step
// time, both printed. Timing decides k, so the test checks the rule against the
// printed figures and that every gap between checkpoints is an interval it
// announced, not how many there are.
TEST(Checkpoint, EveryStepsAutoFollowsWhatACheckpointCosts) {
  const auto dir = scratchDir("checkpoint_auto");
  const auto r = run(kQuickstart + " --output " + (dir / "out").string() +
                         " --set train.epochs=2 --set train.threads=1 --set train.progress=off"
                         " --set checkpoint.every_steps=auto --set checkpoint.keep=100",
                     mpirun(2) + "-x BATCHDIST_FAULT_SLOW_UPDATE_US=50000 ");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("checkpoint: step 1 -> "), std::string::npos) << r.out;
  const std::string head = "checkpoint: every_steps auto: the step waited ";
  std::set<int64_t> announced;
  for (auto at = r.out.find(head); at != std::string::npos; at = r.out.find(head, at + 1)) {
    double w = 0, t = 0;
    long long k = 0;
    ASSERT_EQ(std::sscanf(r.out.c_str() + at + head.size(),
                          "%lf s for a checkpoint, a step takes %lf s: every %lld step(s)", &w, &t, &k),
              3)
        << r.out.substr(at, 200);
    // The figures are printed to 3 decimals: k within the rule's range at their rounding.
    const double lo = std::ceil(std::max(0.0, w - 5e-4) / (0.01 * (t + 5e-4)));
    const double hi = std::ceil((w + 5e-4) / (0.01 * std::max(t - 5e-4, 1e-6)));
    EXPECT_GE(static_cast<double>(k), std::max(1.0, lo)) << r.out.substr(at, 200);
    EXPECT_LE(static_cast<double>(k), std::max(1.0, hi)) << r.out.substr(at, 200);
    announced.insert(k);
  }
  ASSERT_FALSE(announced.empty()) << r.out;
  std::ifstream in(dir / "out" / "report.json");
  const auto report = nlohmann::json::parse(in);
  const auto& cps = report["checkpoints"];
  ASSERT_GE(cps.size(), 1u) << cps.dump();
  EXPECT_EQ(cps[0]["step"], 1);
  for (const auto& c : cps) {
    EXPECT_TRUE(c["background"].get<bool>());
    EXPECT_FALSE(c.contains("error")) << c.dump();
    EXPECT_GT(c["bytes"].get<int64_t>(), 0);
  }
  for (size_t i = 1; i < cps.size(); ++i) {
    const int64_t gap = cps[i]["step"].get<int64_t>() - cps[i - 1]["step"].get<int64_t>();
    EXPECT_TRUE(announced.count(gap)) << "gap " << gap << " after step " << cps[i - 1]["step"] << "\n" << r.out;
  }
}
