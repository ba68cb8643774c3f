// Note [run phases]: the exit code of a run as a pure function of its result and
// the agreed stop signal.
#include <gtest/gtest.h>

#include <csignal>

#include "worker/run.h"

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
