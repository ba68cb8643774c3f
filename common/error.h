#pragma once
// The one exception family of batchdist. Every message a user may see says what
// was wrong, where (file:key, rank, host) and what to do about it.

#include <sstream>
#include <stdexcept>
#include <string>

namespace batchdist {

/// Base of every error batchdist throws on purpose.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
  /// Process exit code the launcher uses for this kind of error.
  virtual int exitCode() const { return 1; }
};

/// Bad user input: config file, --set value, command line, data file. Exit code 2.
class ConfigError : public Error {
 public:
  using Error::Error;
  int exitCode() const override { return 2; }
};

/// A collective, the rendezvous or the process group failed or timed out.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

/// Training went wrong (non-finite parameters, ranks diverged, ...).
class TrainingError : public Error {
 public:
  using Error::Error;
};

namespace detail {
inline void streamAll(std::ostringstream&) {}
template <typename T, typename... Rest>
void streamAll(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  streamAll(os, rest...);
}
}  // namespace detail

/// Note [error text]: what a caught exception brings to a message batchdist
/// writes is its first line: LibTorch appends a backtrace after it, Gloo and
/// NCCL lines of context. The closing period (or "!") and spaces go too, since
/// the caller's sentence goes on. A program's own exception keeps its whole
/// message instead (messageOf in worker/common/torch_error.h): a TorchScript
/// error's cause is on its last line.
inline std::string firstLine(const std::string& what) {
  std::string line = what.substr(0, what.find('\n'));
  while (!line.empty() && (line.back() == '.' || line.back() == '!' || line.back() == ' ')) {
    line.pop_back();
  }
  return line;
}

/// Concatenates the arguments with operator<< into one string.
template <typename... Args>
std::string strCat(const Args&... args) {
  std::ostringstream os;
  detail::streamAll(os, args...);
  return os.str();
}

}  // namespace batchdist

/// gloo-style check: throws E with both values printed when `a op b` fails.
#define BATCHDIST_ENFORCE_OP(E, a, op, b, ...)                                      \
  do {                                                                              \
    const auto& batchdist_a_ = (a);                                                 \
    const auto& batchdist_b_ = (b);                                                 \
    if (!(batchdist_a_ op batchdist_b_)) {                                          \
      throw E(::batchdist::strCat(__VA_ARGS__, " (", #a, " = ", batchdist_a_,       \
                                  ", ", #b, " = ", batchdist_b_, ")"));              \
    }                                                                               \
  } while (0)
