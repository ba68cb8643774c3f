#include "worker/data/sources/tokens.h"

#include <cstring>
#include <filesystem>

#include "common/error.h"
#include "worker/data/sources/npy.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tokens.cc assumes a little-endian host (token files are little-endian)"
#endif

namespace batchdist::worker {
namespace {

constexpr char kNpyMagic[] = "\x93NUMPY";

std::string shapeOf(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += strCat(i ? ", " : "", shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

/// A .npy of token ids: 1-D, uint16, int32 or int64 (parseNpy checks the rest).
TokenFile npyTokens(const MappedFile& f, const std::string& path) {
  const NpyArray a =
      parseNpy(f.data, f.size, path, {NpyType::kUint16, NpyType::kInt32, NpyType::kInt64});
  if (a.shape.size() != 1) {
    throw ConfigError(strCat(path, ": expected a 1-D array of token ids, got shape ",
                             shapeOf(a.shape), "; save arr.reshape(-1) (the windows are cut "
                             "from one flat stream)"));
  }
  TokenFile t;
  t.type = a.type == NpyType::kUint16  ? TokenType::kUint16
           : a.type == NpyType::kInt32 ? TokenType::kInt32
                                       : TokenType::kInt64;
  t.count = a.shape[0];
  t.header_bytes = a.data - f.data;
  t.data = a.data;
  return t;
}

/// A .bin: little-endian uint16 ids, nothing else (nanoGPT's prepare.py).
TokenFile binTokens(const MappedFile& f, const std::string& path) {
  if (f.size % 2 != 0) {
    throw ConfigError(strCat(path, ": ", f.size, " bytes is not a whole number of 2-byte "
                             "tokens; a .bin holds little-endian uint16 token ids (as nanoGPT's "
                             "prepare.py writes them): the file is truncated, or not uint16 "
                             "(save int32 or int64 ids as a .npy)"));
  }
  TokenFile t;
  t.type = TokenType::kUint16;
  t.count = static_cast<int64_t>(f.size / 2);
  t.data = f.data;
  return t;
}

}  // namespace

int64_t TokenFile::itemBytes() const {
  switch (type) {
    case TokenType::kUint16: return 2;
    case TokenType::kInt32: return 4;
    case TokenType::kInt64: return 8;
  }
  return 2;
}

const char* toString(TokenType t) {
  switch (t) {
    case TokenType::kUint16: return "uint16";
    case TokenType::kInt32: return "int32";
    case TokenType::kInt64: return "int64";
  }
  return "?";
}

TokenFile mapTokens(const std::string& path, const std::string& key, int64_t window) {
  MappedFile f = mapFile(path, strCat("check ", key, "; expected token ids: a .bin of "
                                      "little-endian uint16, or a 1-D .npy of uint16, int32 "
                                      "or int64"));
  const bool npy = std::filesystem::path(path).extension() == ".npy" ||
                   (f.size >= 6 && std::memcmp(f.data, kNpyMagic, 6) == 0);
  TokenFile t = npy ? npyTokens(f, path) : binTokens(f, path);
  if (t.count < window) {
    throw ConfigError(strCat(path, ": ", t.count, " token", t.count == 1 ? "" : "s",
                             ", fewer than one sample's window of model.seq_len + 1 = ", window,
                             " tokens; give a longer file, or lower model.seq_len"));
  }
  t.path = path;
  t.mapping = std::move(f.mapping);
  return t;
}

}  // namespace batchdist::worker
