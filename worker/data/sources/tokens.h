#pragma once
// Token files for data.name: tokens (Note [tokens] in worker/data/data.h): a flat
// array of token ids, memory-mapped; the windows are views of it. No LibTorch here.

#include <cstdint>
#include <memory>
#include <string>

namespace batchdist::worker {

/// How the ids are stored: a .bin is uint16 (nanoGPT's prepare.py); a .npy may
/// also hold int32 or int64.
enum class TokenType { kUint16, kInt32, kInt64 };

/// A mapped token file; unmapped when the last copy of `mapping` goes.
struct TokenFile {
  std::string path;
  TokenType type = TokenType::kUint16;
  int64_t count = 0;              ///< tokens in the file
  int64_t header_bytes = 0;       ///< bytes before the first token (a .npy's header; .bin: 0)
  const uint8_t* data = nullptr;  ///< the first token (inside `mapping`)
  std::shared_ptr<void> mapping;
  int64_t itemBytes() const;
};

/// Maps the token file `path` (`key`, data.path or data.val_path, is named in the
/// messages): a .npy (by its extension or its magic) must be a 1-D array of uint16,
/// int32 or int64; anything else is read as little-endian uint16. Throws
/// ConfigError naming the file: missing, a directory, empty, an odd byte count of a
/// .bin, an unsupported .npy dtype or shape, fewer than `window` tokens (one
/// sample: model.seq_len + 1). The ids themselves are checked as batches gather
/// them (Note [tokens]), not here: this reads a .npy's header and nothing else.
TokenFile mapTokens(const std::string& path, const std::string& key, int64_t window);

const char* toString(TokenType t);

}  // namespace batchdist::worker
