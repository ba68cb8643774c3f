#pragma once
// Reading and writing files with the errors a user can act on: every message
// names the file and the cause (errno text), and nothing is read without a bound.

#include <unistd.h>

#include <cstdint>
#include <string>
#include <utility>

namespace batchdist::worker {

/// Note [input files are regular files]: every file a user names for reading (the
/// config, data.path and its .npy/.bin/tar shards, an image list and the images it
/// names, model.path, a checkpoint, a host file) is opened here or by readFileBounded,
/// and only if it is a regular file. A FIFO without a writer blocked open() for
/// ever (every rank, until killed), and a writer's bytes go to one reader only; a
/// device such as /dev/zero reads forever; a socket cannot be opened. They are
/// refused before a byte is read, by what they are: stat() first (a device is not
/// even opened), then open(O_NONBLOCK) and fstat() again (a FIFO put in its place
/// meanwhile cannot block). Symlinks are followed: a link to a FIFO is a FIFO.
struct InputFile {
  InputFile() = default;
  InputFile(InputFile&& o) noexcept { *this = std::move(o); }
  InputFile& operator=(InputFile&& o) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile();

  int fd = -1;                ///< open, blocking, read-only; -1 when not opened (below)
  std::uintmax_t size = 0;    ///< bytes (when open)
  int error = 0;              ///< not opened: errno of stat()/open() (ENOENT, EACCES, ...)
  std::string kind;           ///< not opened: what it is ("a directory", "a pipe (FIFO)",
                              ///< "a character device", "a block device", "a socket")
  /// Why it was not opened: "No such file or directory", "is a pipe (FIFO), not a
  /// regular file", "is a directory, not a regular file".
  std::string why() const;
  bool isDirectory() const { return kind == "a directory"; }
  /// Gives up the descriptor (the caller closes it).
  int release();
};

/// Opens `path` for reading if it is a regular file (Note [input files are
/// regular files]); never blocks, whatever `path` is. Throws nothing: the caller
/// words the error (a ConfigError, or a bad sample under data.on_error).
InputFile openInputFile(const std::string& path);

/// The bound for the metrics file (a file batchdist wrote itself).
constexpr std::uintmax_t kMaxStreamBytes = std::uintmax_t{1} << 30;

/// Reads all of `path`. Throws ConfigError (it is the user's file) naming the
/// file and the cause when it is missing, a directory, not a regular file (Note
/// [input files are regular files]; `hint` then says what to do, else a general
/// "give a regular file"), unreadable, or larger than `max_bytes` (checked
/// before reading). `what` says what the file is for ("config file", "data
/// file"), for the message.
std::string readFileBounded(const std::string& path, std::uintmax_t max_bytes,
                            const std::string& what, const std::string& hint = "");

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
