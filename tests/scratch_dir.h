#pragma once
// Scratch directories for tests. Note [scratch dirs]: ctest runs every GoogleTest
// case as a process of its own, several at once (-j), and the same case may run
// twice at once (a second ctest entry, another build tree's ctest). A fixed name
// under the temp dir is shared by all of them: one test's remove_all deleted
// another's files (`bash: .../job.sbatch: No such file or directory`). So every
// scratch path is made by mkdtemp, unique to its process, and removed only by the
// process that made it. Shell tests do the same with `mktemp -d` and a trap on EXIT.

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace batchdist::testsupport {

namespace detail {

/// The scratch directories this process made, removed when it exits normally.
struct ScratchRegistry {
  std::mutex mu;
  std::vector<std::filesystem::path> dirs;
  pid_t owner = ::getpid();
  ~ScratchRegistry() {
    if (::getpid() != owner) return;  // a forked child that exits removes nothing of its parent's
    std::error_code ec;
    for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
  }
};

inline ScratchRegistry& scratchRegistry() {
  static ScratchRegistry registry;
  return registry;
}

}  // namespace detail

/// A new, empty directory of this process's own, made by mkdtemp (mode 0700):
/// temp_directory_path()/batchdist_<prefix>_XXXXXX (TMPDIR is honoured). Removed
/// with its contents when the process exits normally; a crashed test leaves it
/// behind under its unique name, where it is in nobody's way. Thread-safe.
/// Throws std::runtime_error naming the path and errno when it cannot be made.
inline std::filesystem::path scratchDir(const std::string& prefix) {
  std::string tmpl =
      (std::filesystem::temp_directory_path() / ("batchdist_" + prefix + "_XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    throw std::runtime_error("mkdtemp " + tmpl + ": " + std::strerror(errno));
  }
  auto& r = detail::scratchRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.dirs.emplace_back(tmpl);
  return tmpl;
}

/// A scratch directory removed (with its contents) when it goes out of scope.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix) : path_(scratchDir(prefix)) {}
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string string() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace batchdist::testsupport
