// Rank 0's logs: the progress styles (Note [progress output]), the trainer's
// progress line and metrics points (TrainLog) and metrics.jsonl written as
// training goes (Note [streamed metrics]).
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/scratch_dir.h"
#include "worker/common/console.h"
#include "worker/common/util.h"
#include "worker/report/metrics_log.h"
#include "worker/train/train_log.h"

namespace batchdist::worker {
namespace {

namespace fs = std::filesystem;

/// What `f` prints on std::cout.
template <typename F>
std::string captured(F&& f) {
  std::ostringstream out;
  auto* old = std::cout.rdbuf(out.rdbuf());
  f();
  std::cout.rdbuf(old);
  return out.str();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// `name` in a scratch directory of this test process's own (Note [scratch dirs]),
/// removed when it ends.
fs::path scratch(const std::string& name) {
  static const auto dir = batchdist::testsupport::scratchDir("logs_test");
  return dir / name;
}

MetricPoint point(int64_t step, bool epoch_end = false) {
  MetricPoint m;
  m.step = step;
  m.epoch = 1;
  m.epoch_end = epoch_end;
  m.train_loss = 1.0 / step;
  m.lr = 0.1;
  m.global_batch = 64;
  m.per_gpu = 32;
  m.accum = 1;
  if (epoch_end) m.eval_metrics = {{"accuracy", 0.5}};  // classification's (Note [task])
  return m;
}

TEST(Progress, LinesStylePrintsOnlyAtIntervalsAndNeverAnEscape) {
  Console c(true, ProgressStyle::kLines);
  const auto out = captured([&] {
    c.status("epoch 1/2 step 1/10", false);  // not an interval's end: nothing
    c.status("epoch 1/2 step 2/10", true);   // the first interval: printed
    c.status("epoch 1/2 step 4/10", true);   // within kLinesEverySeconds: not printed
    c.line("epoch 1/2  train_loss 0.5");
  });
  EXPECT_EQ(out, "epoch 1/2 step 2/10\nepoch 1/2  train_loss 0.5\n");
  EXPECT_EQ(out.find('\r'), std::string::npos);
  EXPECT_EQ(out.find('\033'), std::string::npos);
}

TEST(Progress, BarStyleRewritesInPlaceAndClearsBeforeALine) {
  Console c(true, ProgressStyle::kBar);
  const auto out = captured([&] {
    c.status("step 1", false);
    c.line("event");
  });
  EXPECT_EQ(out, "\r\033[Kstep 1\r\033[Kevent\n");
}

TEST(Progress, OffStyleKeepsTheEventsOnly) {
  Console c(true, ProgressStyle::kOff);
  const auto out = captured([&] {
    c.status("step 1", true);
    c.line("event");
  });
  EXPECT_EQ(out, "event\n");
}

TEST(Progress, ATerminalIsToldFromProcByTheDescriptorsTarget) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  EXPECT_FALSE(procFdIsTerminal(getpid(), fds[1]));  // a pipe (| tee log)
  const int file = open(scratch("plain.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(file, 0);
  EXPECT_FALSE(procFdIsTerminal(getpid(), file));  // a file (a Slurm output file)
  EXPECT_FALSE(procFdIsTerminal(999999999, 1));    // no such process
  const int master = posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0);
  ASSERT_EQ(grantpt(master), 0);
  ASSERT_EQ(unlockpt(master), 0);
  const int pts = open(ptsname(master), O_RDWR | O_NOCTTY);
  ASSERT_GE(pts, 0);
  EXPECT_TRUE(procFdIsTerminal(getpid(), pts));  // a pseudo-terminal (mpirun in a terminal)
  for (int fd : {fds[0], fds[1], file, master, pts}) close(fd);
}

TEST(StreamedMetrics, EachPointIsOneCompleteLineAsItIsMade) {
  const auto path = scratch("fresh.jsonl").string();
  {
    std::ofstream(path) << "{\"kind\":\"step\",\"step\":999}\n";  // an earlier run's
  }
  MetricsLog log(path, -1);
  EXPECT_EQ(slurp(path), "");  // a fresh run starts the file empty
  log.append(point(2));
  const auto one = slurp(path);  // on disk before the run ends
  ASSERT_FALSE(one.empty());
  EXPECT_EQ(one.back(), '\n');
  const auto j = nlohmann::json::parse(one);
  EXPECT_EQ(j.at("step"), 2);
  EXPECT_EQ(j.at("global_batch"), 64);
  EXPECT_EQ(j.at("per_gpu_batch"), 32);
  EXPECT_TRUE(j.at("noise_scale").is_null());
  log.append(point(4, true));
  EXPECT_EQ(slurp(path), one + metricsLine(point(4, true)));
  EXPECT_TRUE(nlohmann::json::parse(metricsLine(point(4, true))).contains("eval_accuracy"));
}

TEST(StreamedMetrics, AResumeKeepsTheLinesUpToItsStepAndDropsATornLine) {
  std::string text;
  for (int64_t s : {2, 4, 6, 8}) text += metricsLine(point(s));
  text += "not json\n";                                    // skipped, not fatal
  text += metricsLine(point(10));                          // past the checkpoint: made again
  text += metricsLine(point(12)).substr(0, 20);            // torn by kill -9
  int64_t kept = 0;
  const auto keep = keptMetricLines(text, 8, &kept);
  EXPECT_EQ(kept, 4);
  EXPECT_EQ(keep, metricsLine(point(2)) + metricsLine(point(4)) + metricsLine(point(6)) +
                      metricsLine(point(8)));
  // The file: cut back, then appended after.
  const auto path = scratch("resumed.jsonl").string();
  {
    std::ofstream(path, std::ios::binary) << text;
  }
  MetricsLog log(path, 6);
  EXPECT_EQ(log.keptLines(), 3);
  log.append(point(8));
  EXPECT_EQ(slurp(path), metricsLine(point(2)) + metricsLine(point(4)) + metricsLine(point(6)) +
                             metricsLine(point(8)));
  // A torn line before the resumed step ends what is kept (nothing after it is trusted).
  EXPECT_EQ(keptMetricLines(metricsLine(point(2)).substr(0, 9), 8, &kept), "");
  EXPECT_EQ(kept, 0);
}

TEST(StreamedMetrics, AFileThatCannotBeWrittenWarnsAndTheRunGoesOn) {
  const auto dir = scratch("a_directory");
  fs::create_directories(dir / "metrics.jsonl");  // a directory where the file should be
  ::testing::internal::CaptureStderr();
  MetricsLog log((dir / "metrics.jsonl").string(), -1);
  log.append(point(2));  // no throw, no crash
  const auto err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("metrics.jsonl is not written from here on"), std::string::npos) << err;
  EXPECT_NE(err.find("metrics.jsonl"), std::string::npos);
}

TEST(TrainLog, AboutTenPointsAnEpochAndOneAtItsEndOrAStop) {
  // 100 steps an epoch: every 10th step.
  EXPECT_FALSE(metricsDue(100, 100, 8, false));
  EXPECT_TRUE(metricsDue(100, 100, 9, false));
  EXPECT_TRUE(metricsDue(100, 100, 99, false));
  // 25: every 2nd, and the last (an odd one).
  EXPECT_TRUE(metricsDue(25, 25, 1, false));
  EXPECT_FALSE(metricsDue(25, 25, 2, false));
  EXPECT_TRUE(metricsDue(25, 25, 24, false));
  // Fewer than ten steps: every step.
  EXPECT_TRUE(metricsDue(5, 5, 0, false));
  EXPECT_TRUE(metricsDue(0, 0, 0, false));
  // An epoch cut short (a larger adaptive G) ends at its own last step; a stop at any.
  EXPECT_TRUE(metricsDue(100, 37, 36, false));
  EXPECT_FALSE(metricsDue(100, 100, 36, false));
  EXPECT_TRUE(metricsDue(100, 100, 36, true));
}

TEST(TrainLog, RankZeroMakesThePointsAndTheStyleDecidesTheLine) {
  EpochSoFar e;
  e.steps = e.steps_per_epoch = 100;
  const Console lines(true, ProgressStyle::kLines), bar(true, ProgressStyle::kBar),
      off(true, ProgressStyle::kOff), quiet(false, ProgressStyle::kBar);
  const TrainLog zero(0, 2), one(1, 2);
  const auto due = zero.atStep(lines, e, 9);
  EXPECT_TRUE(due.due && due.line && due.point);
  const auto between = zero.atStep(lines, e, 8);
  EXPECT_FALSE(between.due || between.line || between.point);
  EXPECT_TRUE(zero.atStep(bar, e, 8).line);  // a bar is offered every step
  EXPECT_FALSE(zero.atStep(off, e, 9).line);
  EXPECT_FALSE(one.atStep(quiet, e, 9).line);
  EXPECT_FALSE(one.atStep(quiet, e, 9).point);
  EXPECT_TRUE(one.atStep(quiet, e, 9).due);
}

TEST(TrainLog, APointCoversItsIntervalOverAllRanksAndReachesTheSink) {
  TrainLog log(0, 2);
  std::vector<MetricPoint> sent;
  log.setSink([&](const MetricPoint& m) { sent.push_back(m); });
  Console quiet(false, ProgressStyle::kOff);
  EpochSoFar e;
  e.epoch = 1;
  e.steps = e.steps_per_epoch = 20;
  e.started = monotonicSeconds() - 1;
  e.loss_sum = 4;  // rank 0's, over 8 of 16 samples
  e.samples = 16;
  e.time.data_wait = 0.5;
  StepFigures f;
  f.global_step = 22;
  f.lr = 0.05;
  f.global_batch = 8;
  f.per_gpu = 2;
  f.accum = 2;
  f.peak_memory_mb = 300;
  f.noise_scale = 40;
  MetricsInterval since;
  TrainResult result;
  log.step(quiet, e, 1, log.atStep(quiet, e, 1), f, e.started - 5, since, result);
  e.loss_sum = 7;
  e.samples = 32;
  e.time.data_wait = 0.75;
  f.global_step = 24;
  f.adaptive = true;
  f.progress = 23.5;
  log.step(quiet, e, 3, log.atStep(quiet, e, 3), f, e.started - 5, since, result);
  ASSERT_EQ(result.metrics.size(), 2u);
  ASSERT_EQ(sent.size(), 2u);
  const auto& a = result.metrics[0];
  EXPECT_FALSE(a.epoch_end);
  EXPECT_EQ(a.step, 22);
  EXPECT_EQ(a.epoch, 2);
  EXPECT_DOUBLE_EQ(a.train_loss, 4.0 * 2 / 16);
  EXPECT_DOUBLE_EQ(a.time.data_wait, 0.5);
  EXPECT_GT(a.samples_per_s, 0);
  EXPECT_DOUBLE_EQ(a.lr, 0.05);
  EXPECT_EQ(a.global_batch, 8);
  EXPECT_EQ(a.per_gpu, 2);
  EXPECT_EQ(a.accum, 2);
  EXPECT_DOUBLE_EQ(a.peak_memory_mb, 300);
  EXPECT_DOUBLE_EQ(a.noise_scale, 40);
  EXPECT_LT(a.progress, 0);  // not adaptive
  const auto& b = result.metrics[1];
  EXPECT_EQ(b.step, 24);
  EXPECT_DOUBLE_EQ(b.train_loss, (7.0 - 4.0) * 2 / 16);  // the interval only
  EXPECT_DOUBLE_EQ(b.time.data_wait, 0.25);
  EXPECT_DOUBLE_EQ(b.progress, 23.5);
  EXPECT_EQ(sent[1].step, 24);
  EXPECT_DOUBLE_EQ(since.loss, 7);
  EXPECT_EQ(since.samples, 32);
  // The epoch's end: its own figures, and not from another rank.
  EpochStats h;
  h.epoch = 1;
  h.train_loss = 0.3;
  h.eval_loss = 0.4;
  h.eval_metrics = {{"accuracy", 0.9}};
  log.epochEnd(h, e.time, f, e.started - 5, result);
  TrainLog(1, 2).epochEnd(h, e.time, f, e.started - 5, result);
  ASSERT_EQ(result.metrics.size(), 3u);
  EXPECT_TRUE(result.metrics[2].epoch_end);
  EXPECT_DOUBLE_EQ(result.metrics[2].train_loss, 0.3);
  EXPECT_DOUBLE_EQ(result.metrics[2].eval_loss, 0.4);
  EXPECT_DOUBLE_EQ(result.metrics[2].time.data_wait, 0.75);
}

TEST(TrainLog, TheProgressLineNamesTheStepLossAndLr) {
  TrainLog log(0, 2);
  Console lines(true, ProgressStyle::kLines);
  EpochSoFar e;
  e.steps = e.steps_per_epoch = 100;
  e.started = monotonicSeconds() - 1;
  e.loss_sum = 5;
  e.samples = 20;
  StepFigures f;
  f.epoch_label = "epoch 1/3";
  f.global_step = 10;
  f.lr = 0.1;
  f.steps_left = 290;
  MetricsInterval since;
  TrainResult result;
  const auto out = captured([&] {
    log.step(lines, e, 9, log.atStep(lines, e, 9), f, e.started, since, result);
  });
  EXPECT_EQ(out.rfind("epoch 1/3 step 10/100  loss 0.5000  lr 0.1  ", 0), 0u) << out;
  EXPECT_EQ(out.find("  G "), std::string::npos);  // adaptive only
  EXPECT_EQ(out.find(" mem "), std::string::npos);  // CUDA only
  EXPECT_NE(out.find("  ETA "), std::string::npos);
}

}  // namespace
}  // namespace batchdist::worker
