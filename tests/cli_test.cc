// The real binary, as a user runs it: exit codes and messages for good and bad input.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>

#include "command.h"

namespace {

using Result = batchdist::testsupport::CommandResult;
using batchdist::testsupport::expectCleanError;

Result run(const std::string& args, const std::string& prefix = "") {
  return batchdist::testsupport::runCommand(prefix + std::string(BATCHDIST_BIN) + " " + args);
}

std::string mpirun(int np) {
  return std::string(BATCHDIST_MPIRUN) + " " + BATCHDIST_MPI_FLAGS + " -np " + std::to_string(np) + " ";
}

std::string writeConfig(const std::string& name, const std::string& text) {
  const auto dir = std::filesystem::temp_directory_path() / "batchdist_cli_test";
  std::filesystem::create_directories(dir);
  const auto path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

const std::string kQuickstart = std::string(BATCHDIST_SOURCE_DIR) + "/configs/quickstart.yaml";

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
  EXPECT_NE(r.out.find("backends: gloo nccl"), std::string::npos) << r.out;
#else
  EXPECT_NE(r.out.find(", CPU build, backends: gloo)"), std::string::npos) << r.out;
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

TEST(Cli, MissingFiles) {
  expectCleanError(run("/no/such/config.yaml"), "/no/such/config.yaml: cannot open config file");
  expectCleanError(run(kQuickstart + " -q --set data.name=csv --set data.path=/no/such.csv"),
                   "cannot open data file '/no/such.csv'");
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
  const auto out = std::filesystem::temp_directory_path() / "batchdist_cli_single";
  std::filesystem::remove_all(out);
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
}

TEST(Cli, SearchCacheHitMissAndResearch) {
  const auto out = std::filesystem::temp_directory_path() / "batchdist_cli_search";
  std::filesystem::remove_all(out);
  const std::string base = "search " + std::string(BATCHDIST_SOURCE_DIR) +
                           "/configs/search-cpu.yaml --output " + out.string() +
                           " --set search.max=32 --set search.timed_steps=1 --set search.warmup_steps=1";
  auto cachedFlag = [&] {
    return YAML::LoadFile((out / "search.json").string())["cached"].as<bool>();
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
  const std::string args = kQuickstart + " -q --output " +
                           (std::filesystem::temp_directory_path() / "batchdist_cli_mismatch").string();
  std::string flags = BATCHDIST_MPI_FLAGS;
  const auto r = run(args + " : " + flags + " -np 1 " + BATCHDIST_BIN + " " + args +
                         " --set model.hidden=[32]",
                     mpirun(1));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[rank 1/2 host "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("config differs from rank 0's: model.hidden = [32] here, [128, 64] on rank 0"),
            std::string::npos)
      << r.out;
}

TEST(Cli, Resnet18Cifar10ConfigPlansAgainstCifarFiles) {
  // A miniature CIFAR-10 directory in the real binary layout (10 images a file).
  const auto dir = std::filesystem::temp_directory_path() / "batchdist_cli_cifar";
  std::filesystem::create_directories(dir);
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
                   "cifar-10-batches-bin/data_batch_1.bin' (No such file or directory)");
}
