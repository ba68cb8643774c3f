// TensorBoard event files (Note [tensorboard events]): CRC-32C, the TFRecord
// framing read back and checked, the Event messages parsed with protobuf, the
// tags of metrics points, the resume file's START, and failures that only warn.
// tests/tensorboard_check.sh reads a real run's files with TensorBoard itself.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "tensorboard_event.pb.h"
#include "tests/scratch_dir.h"
#include "worker/report/tensorboard.h"

using namespace batchdist::worker;
namespace fs = std::filesystem;
namespace pb = batchdist::tensorboard;

namespace {

uint64_t getLe(const std::string& s, std::size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(s[at + i])} << (8 * i);
  return v;
}

// TFRecord reader written from the format, not from the writer: both CRCs
// checked; `error` says which record failed and why.
struct Records {
  std::vector<std::string> data;
  std::string error;
};

Records readRecords(const std::string& file) {
  Records r;
  std::size_t at = 0;
  while (at < file.size()) {
    if (file.size() - at < 12) {
      r.error = "torn header at byte " + std::to_string(at);
      return r;
    }
    const uint64_t len = getLe(file, at, 8);
    if (getLe(file, at + 8, 4) != maskCrc(crc32c(file.data() + at, 8))) {
      r.error = "length crc mismatch at byte " + std::to_string(at);
      return r;
    }
    if (file.size() - at - 12 < len + 4) {
      r.error = "torn record at byte " + std::to_string(at);
      return r;
    }
    std::string data = file.substr(at + 12, len);
    if (getLe(file, at + 12 + len, 4) != maskCrc(crc32c(data.data(), data.size()))) {
      r.error = "data crc mismatch at byte " + std::to_string(at);
      return r;
    }
    r.data.push_back(std::move(data));
    at += 12 + len + 4;
  }
  return r;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<pb::Event> readEvents(const std::string& path) {
  const auto recs = readRecords(slurp(path));
  EXPECT_EQ(recs.error, "") << path;
  std::vector<pb::Event> out;
  for (const auto& d : recs.data) {
    pb::Event e;
    EXPECT_TRUE(e.ParseFromString(d)) << path;
    out.push_back(e);
  }
  return out;
}

std::vector<std::string> eventFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) {
      out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());  // TensorBoard's order
  return out;
}

/// A scratch directory of this test's own (Note [scratch dirs]), removed at scope end.
struct TempDir {
  batchdist::testsupport::ScratchDir dir{"tb"};
  std::string path = dir.string();
};

MetricPoint stepPoint(int64_t step) {
  MetricPoint m;
  m.step = step;
  m.epoch = 1;
  m.train_loss = 2.5 / step;
  m.lr = 0.05;
  m.samples_per_s = 1234.5;
  m.time.data_wait = 1;
  m.time.compute = 6;
  m.time.comm = 2;
  m.time.skew = 1;
  m.global_batch = 64;
  m.per_gpu = 16;
  m.accum = 2;
  m.peak_memory_mb = 321.5;
  return m;
}

std::map<std::string, float> values(const pb::Event& e) {
  std::map<std::string, float> out;
  for (const auto& v : e.summary().value()) out[v.tag()] = v.simple_value();
  return out;
}

}  // namespace

TEST(TensorBoard, Crc32cKnownVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);  // RFC 3720 B.4
}

TEST(TensorBoard, MaskRotatesAndOffsets) {
  EXPECT_EQ(maskCrc(0), 0xa282ead8u);
  EXPECT_EQ(maskCrc(0x12345678u), 0x4f730f40u);
}

TEST(TensorBoard, RecordFraming) {
  const std::string rec = tfRecord("abc");
  ASSERT_EQ(rec.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(getLe(rec, 0, 8), 3u);
  EXPECT_EQ(getLe(rec, 8, 4), maskCrc(crc32c(rec.data(), 8)));
  EXPECT_EQ(rec.substr(12, 3), "abc");
  EXPECT_EQ(getLe(rec, 15, 4), maskCrc(crc32c("abc", 3)));
  const auto back = readRecords(rec + tfRecord("") + tfRecord(std::string(300, 'x')));
  EXPECT_EQ(back.error, "");
  EXPECT_EQ(back.data, (std::vector<std::string>{"abc", "", std::string(300, 'x')}));
}

TEST(TensorBoard, CorruptedByteIsDetected) {
  const std::string good = tfRecord(scalarEvent(1.5, 7, {{"train/loss", 0.25}}));
  ASSERT_EQ(readRecords(good).error, "");
  std::string data_hit = good;
  data_hit[14] ^= 0x01;
  EXPECT_NE(readRecords(data_hit).error.find("data crc mismatch"), std::string::npos);
  std::string length_hit = good;
  length_hit[0] ^= 0x01;
  EXPECT_NE(readRecords(length_hit).error.find("length crc mismatch"), std::string::npos);
  EXPECT_NE(readRecords(good.substr(0, good.size() - 1)).error.find("torn"), std::string::npos);
}

TEST(TensorBoard, FileRoundTripThroughProtobuf) {
  TempDir tmp;
  const std::string dir = tmp.path + "/tensorboard";  // made by the writer
  std::string path;
  {
    EventFileWriter w(dir, 0);
    ASSERT_TRUE(w.ok());
    path = w.path();
    appendMetrics(w, stepPoint(10));
    auto p20 = stepPoint(20);
    p20.noise_scale = 42;
    appendMetrics(w, p20);
    MetricPoint end = stepPoint(20);
    end.epoch_end = true;
    end.train_loss = 0.75;
    end.eval_loss = 0.5;
    end.eval_metrics = {{"accuracy", 0.875}};
    end.samples_per_s = 999;
    appendMetrics(w, end);
  }
  EXPECT_EQ(fs::path(path).parent_path().string(), dir);
  EXPECT_EQ(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u) << path;
  const auto ev = readEvents(path);
  ASSERT_EQ(ev.size(), 5u);
  EXPECT_EQ(ev[0].file_version(), "brain.Event:2");
  EXPECT_GT(ev[0].wall_time(), 1.6e9);
  ASSERT_TRUE(ev[1].has_session_log());
  EXPECT_EQ(ev[1].session_log().status(), pb::SessionLog::START);
  EXPECT_EQ(ev[1].step(), 0);

  EXPECT_EQ(ev[2].step(), 10);
  auto v = values(ev[2]);
  EXPECT_FLOAT_EQ(v.at("train/loss"), 0.25f);
  EXPECT_FLOAT_EQ(v.at("train/lr"), 0.05f);
  EXPECT_FLOAT_EQ(v.at("train/samples_per_s"), 1234.5f);
  EXPECT_FLOAT_EQ(v.at("batch/global"), 64);
  EXPECT_FLOAT_EQ(v.at("batch/per_gpu"), 16);
  EXPECT_FLOAT_EQ(v.at("batch/accum"), 2);
  EXPECT_FLOAT_EQ(v.at("time/data_wait"), 0.1f);
  EXPECT_FLOAT_EQ(v.at("time/compute"), 0.6f);
  EXPECT_FLOAT_EQ(v.at("time/communication"), 0.2f);
  EXPECT_FLOAT_EQ(v.at("time/skew"), 0.1f);
  EXPECT_FLOAT_EQ(v.at("memory/peak_mb"), 321.5f);
  EXPECT_EQ(v.count("noise/B_simple"), 0u) << "an unknown noise scale is not written";
  EXPECT_EQ(v.count("eval/loss"), 0u);

  EXPECT_EQ(ev[3].step(), 20);
  EXPECT_FLOAT_EQ(values(ev[3]).at("noise/B_simple"), 42);

  EXPECT_EQ(ev[4].step(), 20);
  v = values(ev[4]);
  EXPECT_EQ(v.size(), 4u);
  EXPECT_FLOAT_EQ(v.at("eval/loss"), 0.5f);
  EXPECT_FLOAT_EQ(v.at("eval/accuracy"), 0.875f);
  EXPECT_FLOAT_EQ(v.at("train/epoch_loss"), 0.75f);
  EXPECT_FLOAT_EQ(v.at("train/epoch_samples_per_s"), 999);
  EXPECT_EQ(v.count("train/loss"), 0u) << "an epoch's end must not repeat the step's train/loss";
}

TEST(TensorBoard, ResumedFileIsNewAndStartsAtTheNextStep) {
  TempDir tmp;
  std::string first, second;
  {
    EventFileWriter w(tmp.path, 0);
    first = w.path();
    for (int s = 10; s <= 60; s += 10) appendMetrics(w, stepPoint(s));
  }
  {
    EventFileWriter w(tmp.path, 41);  // resumed from the checkpoint at step 40
    second = w.path();
    appendMetrics(w, stepPoint(50));
  }
  // Same second, most likely: the second name must differ and sort after the first.
  EXPECT_NE(first, second);
  EXPECT_EQ(eventFiles(tmp.path), (std::vector<std::string>{first, second}));
  const auto ev = readEvents(second);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].file_version(), "brain.Event:2");
  ASSERT_TRUE(ev[1].has_session_log());
  EXPECT_EQ(ev[1].session_log().status(), pb::SessionLog::START);
  EXPECT_EQ(ev[1].step(), 41);
  EXPECT_EQ(ev[2].step(), 50);
  EXPECT_EQ(readEvents(first).size(), 8u) << "the earlier file is left as it was";
}

TEST(TensorBoard, SearchSeriesSkipsCandidatesThatDidNotFit) {
  SearchResult r;
  for (int64_t m : {16, 8, 64, 32}) {  // the walk's order, not by size
    Candidate c;
    c.per_gpu = m;
    c.global_sps = 100.0 * m;
    c.peak_mb = 10.0 * m;
    c.failed = m == 64;
    r.candidates.push_back(c);
  }
  const auto series = searchScalars(r);
  ASSERT_EQ(series.size(), 3u);
  EXPECT_EQ(series[0].first, 8);
  EXPECT_EQ(series[1].first, 16);
  EXPECT_EQ(series[2].first, 32);
  EXPECT_EQ(series[2].second, (std::vector<Scalar>{{"search/samples_per_s", 3200.0},
                                                   {"search/peak_memory_mb", 320.0}}));
  TempDir tmp;
  writeSearchEvents(tmp.path + "/search", r);
  const auto files = eventFiles(tmp.path + "/search");
  ASSERT_EQ(files.size(), 1u);
  const auto ev = readEvents(files[0]);
  ASSERT_EQ(ev.size(), 2u + 3u);
  EXPECT_EQ(ev[4].step(), 32);
  EXPECT_FLOAT_EQ(values(ev[4]).at("search/samples_per_s"), 3200);

  r.cached = true;  // a cached search measured nothing new: no file
  writeSearchEvents(tmp.path + "/cached", r);
  EXPECT_FALSE(fs::exists(tmp.path + "/cached"));
}

TEST(TensorBoard, UncreatableFileOnlyWarns) {
  TempDir tmp;
  const std::string blocker = tmp.path + "/file";
  std::ofstream(blocker) << "x";
  ::testing::internal::CaptureStderr();
  EventFileWriter w(blocker + "/tensorboard", 0);  // a directory under a regular file
  EXPECT_FALSE(w.ok());
  EXPECT_NO_THROW(appendMetrics(w, stepPoint(1)));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("warning: TensorBoard events are not written"), std::string::npos) << err;
  EXPECT_NE(err.find(blocker), std::string::npos) << "the message names the path: " << err;
  EXPECT_NE(err.find("report.tensorboard"), std::string::npos) << err;
}

TEST(TensorBoard, FailedWriteWarnsOnceAndStops) {
  TempDir tmp;
  EventFileWriter w(tmp.path, 0);
  ASSERT_TRUE(w.ok());
  const auto before = fs::file_size(w.path());
  // A file size limit the next event crosses: write(2) is cut short or fails
  // with EFBIG (SIGXFSZ ignored), as a full disk would.
  auto* old_handler = signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  rlimit tight = old;
  tight.rlim_cur = before + 20;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &tight), 0);
  // stderr into a pipe: gtest's CaptureStderr writes a file, which the limit would cut.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const int saved = dup(2);
  dup2(fds[1], 2);
  appendMetrics(w, stepPoint(1));
  appendMetrics(w, stepPoint(2));
  std::cerr << std::flush;
  dup2(saved, 2);
  close(saved);
  close(fds[1]);
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, n);
  close(fds[0]);
  EXPECT_FALSE(w.ok());
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << "one warning, not one per event: " << err;
  EXPECT_NE(err.find(w.path()), std::string::npos) << "the message names the file: " << err;
  EXPECT_LE(fs::file_size(fs::directory_iterator(tmp.path)->path()), before + 20);
}

// Note [tokens per sample]: token samples add tokens/s and the step's tokens
// beside samples/s and the global batch; other samples none of them.
TEST(TensorBoard, TokenSamplesAddTokenScalars) {
  const auto has = [](const std::vector<Scalar>& v, const std::string& tag) {
    return std::any_of(v.begin(), v.end(), [&](const Scalar& s) { return s.first == tag; });
  };
  const auto value = [](const std::vector<Scalar>& v, const std::string& tag) {
    for (const auto& s : v) {
      if (s.first == tag) return s.second;
    }
    return -1.0;
  };
  MetricPoint step = stepPoint(10);
  EXPECT_FALSE(has(metricScalars(step), "train/tokens_per_s"));
  EXPECT_FALSE(has(metricScalars(step), "batch/global_tokens"));
  step.tokens_per_sample = 64;
  const auto v = metricScalars(step);
  EXPECT_DOUBLE_EQ(value(v, "train/tokens_per_s"), 1234.5 * 64);
  EXPECT_DOUBLE_EQ(value(v, "batch/global_tokens"), 64.0 * 64);
  MetricPoint end = stepPoint(20);
  end.epoch_end = true;
  end.samples_per_s = 999;
  EXPECT_FALSE(has(metricScalars(end), "train/epoch_tokens_per_s"));
  end.tokens_per_sample = 64;
  EXPECT_DOUBLE_EQ(value(metricScalars(end), "train/epoch_tokens_per_s"), 999.0 * 64);
  // Note [mfu]: beside the rate when known, never a made-up 0.
  EXPECT_FALSE(has(metricScalars(end), "train/epoch_mfu"));
  EXPECT_FALSE(has(metricScalars(step), "train/mfu"));
  end.mfu = 0.42;
  step.mfu = 0.4;
  EXPECT_DOUBLE_EQ(value(metricScalars(end), "train/epoch_mfu"), 0.42);
  EXPECT_DOUBLE_EQ(value(metricScalars(step), "train/mfu"), 0.4);

  SearchResult r;
  Candidate c;
  c.per_gpu = 8;
  c.global_sps = 500;
  r.candidates.push_back(c);
  EXPECT_FALSE(has(searchScalars(r)[0].second, "search/tokens_per_s"));
  r.tokens_per_sample = 16;
  EXPECT_DOUBLE_EQ(value(searchScalars(r)[0].second, "search/tokens_per_s"), 500.0 * 16);
}
