// Note [fault plan]: the BATCHDIST_FAULT_* variables parsed once, from a fake
// environment (the process's own is never touched).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "worker/common/faults.h"

using batchdist::Error;
using batchdist::worker::CheckpointKill;
using batchdist::worker::FaultPlan;
using batchdist::worker::faultPlanFromEnvironment;

namespace {

using Env = std::map<std::string, std::string>;

FaultPlan planOf(const Env& env) {
  return faultPlanFromEnvironment([&env](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

/// The message of the Error planOf(env) throws ("" when it does not throw).
std::string planError(const Env& env) {
  try {
    planOf(env);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const char* const kOomUsage =
    "' is not RANK:STEP[:TRIES][:forward] (STEP 1-based; e.g. 1:5 makes rank 1 fail its first "
    "try of step 5 in backward, 1:5:1:forward in forward)";

TEST(FaultPlan, AnEmptyEnvironmentIsAnEmptyPlan) {
  const auto plan = planOf({});
  EXPECT_TRUE(plan.empty());
  EXPECT_TRUE(plan.oom.empty());
  EXPECT_TRUE(plan.oomTries(0).empty());
  EXPECT_EQ(plan.slow_update_us, 0);
  EXPECT_EQ(plan.slow_read_us, 0);
  EXPECT_EQ(plan.adapt_figures_rank, -1);
  EXPECT_EQ(plan.checkpoint.point, CheckpointKill::kNone);
  EXPECT_FALSE(plan.checkpoint.killsAt(CheckpointKill::kAfterRename, 10));
  EXPECT_TRUE(plan.version.empty());
  EXPECT_TRUE(FaultPlan{}.empty());
}

// tests/oom_backoff.sh passes -x BATCHDIST_FAULT_OOM="" for a run without faults.
TEST(FaultPlan, EmptyValuesAreUnset) {
  EXPECT_TRUE(planOf({{"BATCHDIST_FAULT_OOM", ""}, {"BATCHDIST_FAULT_SLOW_UPDATE_US", ""},
                      {"BATCHDIST_FAULT_SLOW_READ_US", ""}, {"BATCHDIST_FAULT_ADAPT_FIGURES", ""},
                      {"BATCHDIST_FAULT_CHECKPOINT", ""}, {"BATCHDIST_FAULT_CHECKPOINT_STEP", ""},
                      {"BATCHDIST_FAULT_VERSION", ""}, {"BATCHDIST_FAULT_HANG", ""}})
                  .empty());
  EXPECT_TRUE(planOf({{"BATCHDIST_FAULT_OOM", ",,"}}).empty());
}

TEST(FaultPlan, EveryVariableIsRead) {
  const auto plan = planOf({{"BATCHDIST_FAULT_OOM", "1:5,0:3:2,1:7:1:forward"},
                            {"BATCHDIST_FAULT_SLOW_UPDATE_US", "2000"},
                            {"BATCHDIST_FAULT_SLOW_READ_US", "1500"},
                            {"BATCHDIST_FAULT_ADAPT_FIGURES", "1"},
                            {"BATCHDIST_FAULT_CHECKPOINT", "after_files"},
                            {"BATCHDIST_FAULT_CHECKPOINT_STEP", "60"},
                            {"BATCHDIST_FAULT_VERSION", "0.0.1-other"},
                            {"BATCHDIST_FAULT_UNKNOWN", "ignored"}});
  EXPECT_FALSE(plan.empty());
  ASSERT_EQ(plan.oom.size(), 3u);  // every rank's entries, in order
  EXPECT_EQ(plan.oom[1].rank, 0);
  EXPECT_EQ(plan.oom[1].step, 3);
  EXPECT_EQ(plan.oom[1].tries, 2);
  EXPECT_FALSE(plan.oom[1].forward);
  EXPECT_TRUE(plan.oom[2].forward);
  using Tries = std::vector<std::pair<int64_t, bool>>;
  EXPECT_EQ(plan.oomTries(0), (Tries{{3, false}, {3, false}}));
  EXPECT_EQ(plan.oomTries(1), (Tries{{5, false}, {7, true}}));
  EXPECT_TRUE(plan.oomTries(2).empty());
  EXPECT_EQ(plan.slow_update_us, 2000);
  EXPECT_EQ(plan.slow_read_us, 1500);
  EXPECT_EQ(plan.adapt_figures_rank, 1);
  EXPECT_EQ(plan.checkpoint.point, CheckpointKill::kAfterFiles);
  EXPECT_EQ(plan.checkpoint.step, 60);
  EXPECT_EQ(plan.version, "0.0.1-other");
  EXPECT_EQ(plan.hang.rank, -1);
}

TEST(FaultPlan, HangNamesARankAndAStep) {
  const auto plan = planOf({{"BATCHDIST_FAULT_HANG", "3:20"}});
  EXPECT_FALSE(plan.empty());
  EXPECT_EQ(plan.hang.rank, 3);
  EXPECT_EQ(plan.hang.step, 20);
  for (const std::string bad : {"3", "3:0", "-1:5", "x:5", "3:5:1", "3:"}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(planError({{"BATCHDIST_FAULT_HANG", bad}}).rfind("BATCHDIST_FAULT_HANG: '", 0), 0u);
  }
  EXPECT_EQ(planError({{"BATCHDIST_FAULT_HANG", "3"}}),
            "BATCHDIST_FAULT_HANG: '3' is not RANK:STEP (STEP 1-based; e.g. 3:20 makes rank 3 hang "
            "before step 20)");
}

TEST(FaultPlan, CheckpointKillWithAndWithoutAStep) {
  auto any = planOf({{"BATCHDIST_FAULT_CHECKPOINT", "after_rename"}}).checkpoint;
  EXPECT_EQ(any.step, 0);
  EXPECT_TRUE(any.killsAt(CheckpointKill::kAfterRename, 10));  // no step: any checkpoint
  EXPECT_TRUE(any.killsAt(CheckpointKill::kAfterRename, 20));
  EXPECT_FALSE(any.killsAt(CheckpointKill::kAfterFiles, 10));
  auto at8 = planOf({{"BATCHDIST_FAULT_CHECKPOINT", "after_rename"},
                     {"BATCHDIST_FAULT_CHECKPOINT_STEP", "8"}})
                 .checkpoint;
  EXPECT_FALSE(at8.killsAt(CheckpointKill::kAfterRename, 4));
  EXPECT_TRUE(at8.killsAt(CheckpointKill::kAfterRename, 8));
  // A step alone kills nothing.
  EXPECT_FALSE(planOf({{"BATCHDIST_FAULT_CHECKPOINT_STEP", "8"}})
                   .checkpoint.killsAt(CheckpointKill::kAfterRename, 8));
}

// As BATCHDIST_FAULT_SLOW_READ_US always did: a negative delay is no delay.
TEST(FaultPlan, NegativeDelaysAreNoDelay) {
  const auto plan = planOf({{"BATCHDIST_FAULT_SLOW_READ_US", "-5"},
                            {"BATCHDIST_FAULT_SLOW_UPDATE_US", "-5"}});
  EXPECT_EQ(plan.slow_read_us, 0);
  EXPECT_EQ(plan.slow_update_us, 0);
}

TEST(FaultPlan, BadOomItemsAreNamedWithTheUsage) {
  for (const std::string item : {"1", "x:5", "1:0", "-1:5", "1:5:0", "1:5:1:2", "1:5x",
                                 "1:forward", "1:5:forward:1", "1:5:1:backward"}) {
    SCOPED_TRACE(item);
    EXPECT_EQ(planError({{"BATCHDIST_FAULT_OOM", "0:3," + item}}),
              "BATCHDIST_FAULT_OOM: '" + item + kOomUsage);
  }
  EXPECT_EQ(planOf({{"BATCHDIST_FAULT_OOM", "1:5:forward"}}).oomTries(1),
            (std::vector<std::pair<int64_t, bool>>{{5, true}}));
}

TEST(FaultPlan, BadNumbersAreNamedNotReadAsZero) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"BATCHDIST_FAULT_SLOW_UPDATE_US", "2ms"},
      {"BATCHDIST_FAULT_SLOW_UPDATE_US", "abc"},
      {"BATCHDIST_FAULT_SLOW_READ_US", "fast"},
      {"BATCHDIST_FAULT_SLOW_READ_US", "99999999999999999999"},
      {"BATCHDIST_FAULT_CHECKPOINT_STEP", "eight"},
      {"BATCHDIST_FAULT_CHECKPOINT_STEP", "0"},
      {"BATCHDIST_FAULT_ADAPT_FIGURES", "rank1"},
      {"BATCHDIST_FAULT_ADAPT_FIGURES", "-1"},
      {"BATCHDIST_FAULT_ADAPT_FIGURES", " 1"},
  };
  for (const auto& [var, value] : cases) {
    SCOPED_TRACE(var + "=" + value);
    const auto message = planError({{var, value}});
    EXPECT_EQ(message.rfind(var + ": '" + value + "' is not ", 0), 0u) << message;
  }
}

TEST(FaultPlan, AnUnknownCheckpointPointIsNamed) {
  EXPECT_EQ(planError({{"BATCHDIST_FAULT_CHECKPOINT", "after_manifest"}}),
            "BATCHDIST_FAULT_CHECKPOINT: 'after_manifest' is not a point of the checkpoint "
            "write: after_files or after_rename");
}

}  // namespace
