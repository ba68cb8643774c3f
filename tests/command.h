#pragma once
// Running the real binary from a test: exit code and output, and the standard
// check for a bad-input run.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace batchdist::testsupport {

struct CommandResult {
  int code = -1;
  std::string out;  ///< stdout and stderr together
};

/// Runs `cmd` with sh; 128 + signal for a command killed by a signal.
inline CommandResult runCommand(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

/// A failed run: exit code `code`, the expected message exactly once, no crash output.
inline void expectCleanFailure(const CommandResult& r, int code, const std::string& message) {
  EXPECT_EQ(r.code, code) << r.out;
  const auto at = r.out.find(message);
  EXPECT_NE(at, std::string::npos) << "missing '" << message << "' in:\n" << r.out;
  if (at != std::string::npos) {
    EXPECT_EQ(r.out.find(message, at + 1), std::string::npos) << "printed twice:\n" << r.out;
  }
  for (const char* crash : {"terminate called", "Aborted", "Segmentation", "Exception raised from",
                            "core dumped", "what():"}) {
    EXPECT_EQ(r.out.find(crash), std::string::npos) << crash << " in:\n" << r.out;
  }
}

/// A bad-input run: exit code 2, the expected message exactly once, no crash output.
inline void expectCleanError(const CommandResult& r, const std::string& message) {
  expectCleanFailure(r, 2, message);
}

}  // namespace batchdist::testsupport
