// worker/common/files: writes that other processes and threads may race.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "tests/scratch_dir.h"
#include "worker/common/files.h"

namespace fs = std::filesystem;
using batchdist::worker::readFileBounded;
using batchdist::worker::writeFileAtomic;

namespace {

// Note [atomic writes]: with one fixed "<path>.tmp", two writers of a path wrote
// into one temporary file, and the one whose rename came second failed ("cannot
// write ...: No such file or directory") or renamed the other's half-written file.
TEST(Files, ConcurrentAtomicWritesOfOnePathEachLandWhole) {
  const batchdist::testsupport::ScratchDir dir("files_test");
  const auto path = (dir.path() / "search_cache.json").string();
  constexpr int kWriters = 6;
  constexpr int kWrites = 40;
  std::vector<std::string> texts;
  for (int w = 0; w < kWriters; ++w) texts.push_back(std::string(20000 + 1000 * w, char('a' + w)));
  std::atomic<int> failures{0};
  std::string first_failure;
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      for (int i = 0; i < kWrites; ++i) {
        try {
          writeFileAtomic(path, texts[w]);
        } catch (const batchdist::Error& e) {
          if (failures++ == 0) first_failure = e.what();
        }
      }
    });
  }
  for (auto& t : writers) t.join();
  EXPECT_EQ(failures.load(), 0) << first_failure;
  const auto got = readFileBounded(path, 1 << 20, "test file");
  EXPECT_NE(std::find(texts.begin(), texts.end(), got), texts.end())
      << "a torn file of " << got.size() << " bytes";
  for (const auto& e : fs::directory_iterator(dir.path())) {  // no temporary file left
    EXPECT_EQ(e.path().filename(), "search_cache.json") << e.path();
  }
}

TEST(Files, AnAtomicWriteIntoAMissingDirectoryMakesIt) {
  const batchdist::testsupport::ScratchDir dir("files_test");
  const auto path = (dir.path() / "a" / "b" / "report.json").string();
  writeFileAtomic(path, "{}\n");
  EXPECT_EQ(readFileBounded(path, 100, "test file"), "{}\n");
  EXPECT_EQ(fs::status(path).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                fs::perms::others_read);
}

}  // namespace
