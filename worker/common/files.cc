#include "worker/common/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "common/error.h"

namespace batchdist::worker {
namespace {

std::string errnoText(int err) { return std::strerror(err); }

}  // namespace

std::string byteSize(std::uintmax_t bytes) {
  char buf[32];
  if (bytes >= (std::uintmax_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / double(1 << 30));
  } else if (bytes >= (std::uintmax_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / double(1 << 20));
  } else if (bytes >= 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%ju bytes", bytes);
  }
  return buf;
}

namespace {

/// What a file of type `mode` is, for a message ("a character device").
std::string fileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a pipe (FIFO)";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

InputFile& InputFile::operator=(InputFile&& o) noexcept {
  std::swap(fd, o.fd);
  size = o.size;
  error = o.error;
  kind = std::move(o.kind);
  return *this;
}

InputFile::~InputFile() {
  if (fd >= 0) ::close(fd);
}

int InputFile::release() { return std::exchange(fd, -1); }

std::string InputFile::why() const {
  if (!kind.empty()) return strCat("is ", kind, ", not a regular file");
  return errnoText(error);
}

InputFile openInputFile(const std::string& path) {
  InputFile f;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    f.error = errno;
    return f;
  }
  if (!S_ISREG(st.st_mode)) {
    f.kind = fileKind(st.st_mode);
    return f;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    f.error = errno;
    return f;
  }
  // Replaced by a FIFO or device between stat() and open(): it is what fstat says.
  if (::fstat(fd, &st) != 0) f.error = errno;
  else if (!S_ISREG(st.st_mode)) f.kind = fileKind(st.st_mode);
  if (f.error != 0 || !f.kind.empty()) {
    ::close(fd);
    return f;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  f.fd = fd;
  f.size = static_cast<std::uintmax_t>(st.st_size);
  return f;
}

namespace {

/// The ConfigError for a user's file `f` that could not be opened as `what`.
ConfigError notOpened(const std::string& path, const InputFile& f, const std::string& what,
                      const std::string& hint) {
  if (f.isDirectory()) return ConfigError(strCat(path, ": is a directory, not a ", what));
  if (!f.kind.empty()) {
    return ConfigError(strCat(path, ": ", what, " is ", f.kind, ", not a regular file; ",
                              hint.empty() ? "give a regular file (save a pipe's output to one first)"
                                           : hint));
  }
  return ConfigError(strCat(path, ": cannot open ", what, " (", errnoText(f.error), ")"));
}

}  // namespace

std::string readFileBounded(const std::string& path, std::uintmax_t max_bytes,
                            const std::string& what, const std::string& hint) {
  const InputFile f = openInputFile(path);
  if (f.fd < 0) throw notOpened(path, f, what, hint);
  const auto too_large = [&](const std::string& size) {
    return ConfigError(strCat(path, ": ", what, " is too large (", size, "; at most ",
                              byteSize(max_bytes), " is read)"));
  };
  if (f.size > max_bytes) throw too_large(byteSize(f.size));
  std::string out;
  out.reserve(static_cast<std::size_t>(f.size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw ConfigError(strCat(path, ": cannot read ", what, " (", errnoText(errno), ")"));
    }
    if (n == 0) break;
    if (out.size() + static_cast<std::size_t>(n) > max_bytes) {  // it grew while being read
      throw too_large("more than " + byteSize(max_bytes));
    }
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

void writeFileAtomic(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) {
    fs::create_directories(p.parent_path(), ec);
    if (ec) throw Error(strCat("cannot write ", path, ": cannot create its directory (", ec.message(), ")"));
  }
  // Note [atomic writes]: the temporary file's name is unique (mkstemp), so two
  // writers of one path (two jobs sharing a search.cache, two ranks' report paths)
  // never write into one temporary file: each renames a whole file, the last wins.
  std::string tmp = path + ".tmp.XXXXXX";
  const auto fail = [&](int err) {
    ::unlink(tmp.c_str());
    return Error(strCat("cannot write ", path, ": ", errnoText(err)));
  };
  {
    ScopedFd f;
    f.fd = ::mkostemp(tmp.data(), O_CLOEXEC);
    if (f.fd < 0) throw Error(strCat("cannot write ", path, ": ", errnoText(errno)));
    if (::fchmod(f.fd, 0644) != 0) throw fail(errno);  // mkstemp makes it 0600
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(f.fd, text.data() + done, text.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw fail(errno);
      }
      done += static_cast<std::size_t>(n);
    }
    if (::fsync(f.fd) != 0) throw fail(errno);
    const int fd = f.fd;
    f.fd = -1;
    if (::close(fd) != 0) throw fail(errno);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) throw fail(errno);
}

void checkWritableDirectory(const std::string& dir, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw Error(strCat("cannot write ", what, " to ", dir, ": ",
                       ec ? ec.message() : std::string("not a directory")));
  }
  const std::string probe = (fs::path(dir) / ".batchdist-write-check").string();
  ScopedFd f;
  f.fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd < 0) {
    throw Error(strCat("cannot write ", what, " to ", dir, ": ", errnoText(errno)));
  }
  ::unlink(probe.c_str());
}

void checkWritableFile(const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    throw Error(strCat("cannot write ", what, " to ", path, ": it is a directory"));
  }
  const auto parent = fs::path(path).parent_path();
  checkWritableDirectory(parent.empty() ? "." : parent.string(), what);
  if (fs::exists(path, ec) && ::access(path.c_str(), W_OK) != 0) {
    throw Error(strCat("cannot write ", what, " to ", path, ": ", errnoText(errno)));
  }
}

}  // namespace batchdist::worker
