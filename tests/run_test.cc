// Note [run phases]: the exit code of a run as a pure function of its result and
// the agreed stop signal.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "tests/scratch_dir.h"
#include "common/error.h"
#include "worker/run.h"
#include "worker/run_decision.h"

using namespace batchdist::worker;

TEST(RunExitCode, CompletedIsZeroWhateverTheSignal) {
  TrainResult r;
  EXPECT_EQ(runExitCode(r, 0), 0);
  EXPECT_EQ(runExitCode(r, SIGTERM), 0);  // the signal came after the last step
}

TEST(RunExitCode, AStopIs128PlusTheSignalAndSigtermWhenNoneIsKnown) {
  TrainResult r;
  r.completed = false;
  EXPECT_EQ(runExitCode(r, SIGUSR1), 128 + SIGUSR1);
  EXPECT_EQ(runExitCode(r, SIGINT), 128 + SIGINT);
  EXPECT_EQ(runExitCode(r, 0), 128 + SIGTERM);
  r.checkpoints.push_back({8, "ck/step-00000008", 0.1, 100, /*on_signal=*/true, ""});
  EXPECT_EQ(runExitCode(r, SIGTERM), 128 + SIGTERM);  // its checkpoint was written: resumable
}

TEST(RunExitCode, AFailureOrALostStopCheckpointIsOne) {
  TrainResult r;
  r.completed = false;
  r.failure = "out of memory at per-GPU batch 2, the minimum";
  EXPECT_EQ(runExitCode(r, SIGTERM), 1);
  TrainResult lost;
  lost.completed = false;
  lost.checkpoints.push_back({8, "ck/step-00000008", 0.1, 0, /*on_signal=*/true, "No space left on device"});
  EXPECT_EQ(runExitCode(lost, SIGTERM), 1);
  // A failed periodic checkpoint before a written stop checkpoint does not count.
  TrainResult later;
  later.completed = false;
  later.checkpoints.push_back({4, "ck/step-00000004", 0.1, 0, false, "No space left on device"});
  later.checkpoints.push_back({8, "ck/step-00000008", 0.1, 100, true, ""});
  EXPECT_EQ(runExitCode(later, SIGUSR1), 128 + SIGUSR1);
}

// Note [tokens per sample]: `batchdist plan --json` on token windows carries the
// tokens of a sample (and of a step, when the global batch is known) whether the
// per-GPU batch is fixed or searched (auto); on other samples neither has them.
TEST(PlanOutput, TokenKeysWithAFixedAndAnAutoPerGpuBatch) {
  const batchdist::testsupport::ScratchDir dir("plan_output_tokens");
  const auto d = dir.string();
  std::vector<uint16_t> ids(64 * 40 + 1);  // 40 windows of 64 + 1
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>(i % 256);
  std::ofstream(d + "/train.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 2));
  std::ofstream(d + "/gpt.yaml") << "model: {name: gpt, seq_len: 64}\n"
                                    "data: {name: tokens, path: train.bin, val_fraction: 0.1}\n"
                                    "batch: {global: 8}\n";
  std::ofstream(d + "/mlp.yaml") << "data: {name: synthetic, samples: 400}\nbatch: {global: 8}\n";
  const auto plan = [&](const std::string& config, std::vector<std::string> sets) {
    RunRequest req;
    req.config_path = d + "/" + config;
    req.sets = std::move(sets);
    return nlohmann::json::parse(planOutput(req, 2, /*json=*/true));
  };
  const auto fixed = plan("gpt.yaml", {});
  const auto searched = plan("gpt.yaml", {"batch.per_gpu=auto"});
  EXPECT_EQ(fixed.at("per_gpu_batch").get<int64_t>(), 4);
  EXPECT_EQ(searched.at("per_gpu_batch").get<std::string>(), "auto");
  for (const auto* j : {&fixed, &searched}) {
    EXPECT_EQ(j->at("tokens_per_sample").get<int64_t>(), 64) << j->dump();
    EXPECT_EQ(j->at("tokens_per_step").get<int64_t>(), 8 * 64) << j->dump();
    EXPECT_FALSE(j->contains("global_tokens_asked")) << j->dump();
  }
  // The batch in tokens (Note [global tokens]): 1000 tokens = 15.6 windows -> 16.
  const auto asked = plan("gpt.yaml", {"batch.per_gpu=auto", "batch.global=null",
                                       "batch.global_tokens=1000"});
  EXPECT_EQ(asked.at("tokens_per_step").get<int64_t>(), 16 * 64) << asked.dump();
  EXPECT_EQ(asked.at("global_tokens_asked").get<int64_t>(), 1000) << asked.dump();
  // The global batch searched too: the tokens of a sample, no step to count.
  const auto open = plan("gpt.yaml", {"batch.per_gpu=auto", "batch.global=auto"});
  EXPECT_EQ(open.at("tokens_per_sample").get<int64_t>(), 64) << open.dump();
  EXPECT_FALSE(open.contains("tokens_per_step")) << open.dump();
  for (const auto& sets : {std::vector<std::string>{}, std::vector<std::string>{"batch.per_gpu=auto"}}) {
    const auto samples = plan("mlp.yaml", sets);
    EXPECT_TRUE(samples.contains("per_gpu_batch")) << samples.dump();
    for (const auto& [key, value] : samples.items()) {
      EXPECT_EQ(key.find("tokens"), std::string::npos) << key;
    }
  }
}

// Note [run decisions]: a resume's batch is a value computed from the checkpoint's
// plan and this world size; the config it came from is not touched.
TEST(RunDecision, AResumedBatchKeepsGAndTheLargestPerGpuThatStillDivides) {
  BatchConfig asked;
  asked.global = 64;
  asked.per_gpu = 16;
  asked.accum = 2;
  ManifestPlan then;
  then.global = 96;
  then.per_gpu = 12;
  then.world_size = 4;
  const auto same = resumedBatch(asked, then, 4, /*has_bn=*/false, "ck");
  EXPECT_EQ(same.global, 96);
  EXPECT_EQ(same.per_gpu, 12);
  EXPECT_EQ(same.accum, 0);  // planned again
  const auto fewer = resumedBatch(asked, then, 3, false, "ck");  // G / W = 32: 12 -> 8
  EXPECT_EQ(fewer.per_gpu, 8);
  EXPECT_FALSE(fewer.per_gpu_auto);
  asked.per_gpu_auto = true;  // a new world size: the search picks m again
  EXPECT_TRUE(resumedBatch(asked, then, 3, false, "ck").per_gpu_auto);
  EXPECT_FALSE(resumedBatch(asked, then, 4, false, "ck").per_gpu_auto);
  EXPECT_EQ(asked.global, 64);  // the asked batch is a value, untouched
}

TEST(RunDecision, AGlobalBatchThatDoesNotSplitNamesTheWorldSizesThatDo) {
  BatchConfig asked;
  asked.min_per_gpu = 2;
  ManifestPlan then;
  then.global = 12;
  then.per_gpu = 6;
  then.world_size = 2;
  try {
    resumedBatch(asked, then, 5, /*has_bn=*/true, "out/ck/step-00000008");
    FAIL() << "12 does not split over 5 ranks";
  } catch (const batchdist::ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot resume out/ck/step-00000008 on 5 rank(s)"), std::string::npos) << what;
    EXPECT_NE(what.find("of at least 2"), std::string::npos) << what;
    EXPECT_NE(what.find("world sizes that work: 1, 2, 3, 4, 6"), std::string::npos) << what;
  }
}

TEST(RunDecision, TheDecidedConfigIsACopyWithTheBatchAndLevers) {
  const Config cfg = parseConfig("batch: {global: 32, per_gpu: auto}\ndist: {shard: auto}\n",
                                 "test.yaml", {});
  ASSERT_EQ(cfg.dist.shard, Shard::kAuto);
  BatchConfig batch = cfg.batch;
  batch.global = 48;
  batch.per_gpu = 8;
  batch.per_gpu_auto = false;
  const Config d = decidedConfig(cfg, batch, Levers{Shard::kOptimizer, Recompute::kOn});
  EXPECT_EQ(d.batch.global, 48);
  EXPECT_EQ(d.batch.per_gpu, 8);
  EXPECT_EQ(d.dist.shard, Shard::kOptimizer);
  EXPECT_EQ(d.model.recompute, Recompute::kOn);
  EXPECT_EQ(d.resolved["batch"]["global"], 48);  // a checkpoint of the run records the kept G
  EXPECT_TRUE(d.resolved["batch"]["accum"].is_null());
  EXPECT_EQ(d.resolved["dist"]["shard"], "auto");  // what the user asked: a resume still matches
  EXPECT_EQ(cfg.batch.global, 32);                  // the validated config is untouched
  EXPECT_EQ(cfg.dist.shard, Shard::kAuto);
  const Config none = decidedConfig(cfg, std::nullopt, std::nullopt);
  EXPECT_EQ(none.resolved, cfg.resolved);
  EXPECT_EQ(none.dist.shard, Shard::kAuto);
}
