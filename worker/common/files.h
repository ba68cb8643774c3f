#pragma once
// Reading and writing files with the errors a user can act on: every message
// names the file and the cause (errno text), and nothing is read without a bound.

#include <unistd.h>

#include <cstdint>
#include <string>

namespace batchdist::worker {

/// Most bytes read from a pipe or device. Its size is known only once it has
/// all been read into memory, so a bound meant for a regular file whose size is
/// checked before reading (a 16 GiB data set) would first fill that much memory
/// from /dev/zero or a runaway producer.
constexpr std::uintmax_t kMaxStreamBytes = std::uintmax_t{1} << 30;

/// Reads all of `path`. Throws ConfigError (it is the user's file) naming the
/// file and the cause when it is missing, a directory, unreadable, or larger
/// than `max_bytes` (checked before reading for regular files; while reading for
/// pipes and devices such as /dev/zero, which are also cut at kMaxStreamBytes).
/// `what` says what the file is for ("config file", "data file"), for the message.
std::string readFileBounded(const std::string& path, std::uintmax_t max_bytes,
                            const std::string& what);

/// Writes `text` to `path` atomically (temp file, fsync, rename; parent
/// directories created). On failure the temporary file is removed, `path` keeps
/// its earlier content, and Error names the file and the cause (e.g. "No space
/// left on device").
void writeFileAtomic(const std::string& path, const std::string& text);

/// Throws Error naming `dir` and the cause unless files can be created in it
/// (creating it if needed). For checking outputs before a long run starts.
void checkWritableDirectory(const std::string& dir, const std::string& what);

/// Throws Error naming `path` and the cause unless `path` can be written later:
/// it is not a directory, and its directory is writable.
void checkWritableFile(const std::string& path, const std::string& what);

/// A file descriptor closed on every path out (fd < 0: none). A caller that
/// must see close()'s error closes it itself and sets fd to -1.
struct ScopedFd {
  int fd = -1;
  ScopedFd() = default;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() {
    if (fd >= 0) ::close(fd);
  }
};

/// "1.5 MiB" style size text.
std::string byteSize(std::uintmax_t bytes);

}  // namespace batchdist::worker
