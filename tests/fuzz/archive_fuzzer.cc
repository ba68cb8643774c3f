// libFuzzer target for the input pipeline's file readers (see tests/fuzz/README.md):
// the same bytes go to indexTar (through a temp file), parseNpy and mapNpy,
// parseImageList and readImageList. Each must return or throw
// batchdist::ConfigError and keep its invariants (archive_fuzz_check.h, shared
// with tests/data_fuzz_test.cc); any other exception, a crash, a sanitizer
// report, a hang or a huge allocation is a bug.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "archive_fuzz_check.h"

namespace {

/// One temp file per process, rewritten for every input.
const std::string& tempPath() {
  static const std::string path = [] {
    std::string tmpl = "/tmp/batchdist_archive_fuzz_XXXXXX";
    const int fd = ::mkstemp(tmpl.data());
    if (fd < 0) std::abort();
    ::close(fd);
    std::atexit([] { ::unlink(tempPath().c_str()); });
    return tmpl;
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  batchdist::fuzz::ArchiveOutcome outcome;
  const std::string problem = batchdist::fuzz::checkArchive(data, size, tempPath(), &outcome);
  if (!problem.empty()) {
    std::fprintf(stderr, "archive contract broken: %s\n", problem.c_str());
    std::abort();
  }
  return 0;
}
