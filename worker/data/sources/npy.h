#pragma once
// A NumPy .npy file, memory-mapped: the header is parsed, the data is never read
// whole (pages come in as samples are gathered). No LibTorch here.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace batchdist::worker {

enum class NpyType { kUint8, kFloat16, kFloat32, kFloat64, kInt32, kInt64, kUint16 };

/// A read-only mapping; unmapped when the last copy goes.
struct NpyArray {
  std::string path;
  NpyType type = NpyType::kUint8;
  std::vector<int64_t> shape;  ///< C order
  const uint8_t* data = nullptr;  ///< first element (inside `mapping`)
  std::shared_ptr<void> mapping;  ///< keeps the mmap alive
  int64_t itemBytes() const;
  int64_t rowBytes() const;  ///< bytes of one x[i]
};

/// A whole regular file, mapped read-only; unmapped when the last copy of
/// `mapping` goes. Pages are read as they are touched, never the file at once.
struct MappedFile {
  const uint8_t* data = nullptr;
  std::size_t size = 0;
  std::shared_ptr<void> mapping;
};

/// Maps `path` read-only (the .npy arrays, the token files of Note [tokens]).
/// Throws ConfigError naming the file when it cannot be opened, is a directory or
/// not a regular file, or is empty; `hint` (which key to check, what was expected)
/// ends those messages.
MappedFile mapFile(const std::string& path, const std::string& hint);

/// Maps `path` and checks its header. `allowed` lists the element types the
/// caller accepts. Throws ConfigError naming the file and what is wrong: wrong
/// magic, unsupported version, a dtype not in `allowed` (big-endian included),
/// fortran_order True, a malformed header, data shorter than the shape says.
NpyArray mapNpy(const std::string& path, const std::vector<NpyType>& allowed);

/// Parses a header dict held in memory (for the fuzzer and the tests): same
/// checks as mapNpy against a buffer of `size` bytes.
NpyArray parseNpy(const uint8_t* data, std::size_t size, const std::string& path,
                  const std::vector<NpyType>& allowed);

const char* toString(NpyType t);

}  // namespace batchdist::worker
