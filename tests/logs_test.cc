// Rank 0's logs: the progress styles (Note [progress output]) and metrics.jsonl
// written as training goes (Note [streamed metrics]).
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/scratch_dir.h"
#include "worker/common/console.h"
#include "worker/report/metrics_log.h"

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
  testing::internal::CaptureStderr();
  MetricsLog log((dir / "metrics.jsonl").string(), -1);
  log.append(point(2));  // no throw, no crash
  const auto err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("metrics.jsonl is not written from here on"), std::string::npos) << err;
  EXPECT_NE(err.find("metrics.jsonl"), std::string::npos);
}

}  // namespace
}  // namespace batchdist::worker
