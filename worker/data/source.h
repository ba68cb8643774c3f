#pragma once
// Note [sources]: a data set that does not fit in memory is a Source: a list of
// samples read one at a time by index (an image file, a tar member). The shard
// plan decides which indices a rank reads; the Source how one index becomes
// encoded bytes; decode + crop (Note [decode less]) turn the bytes into a uint8
// sample; the loader only schedules (Note [loader]). No LibTorch here.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "worker/data/sources/image_folder.h"
#include "worker/data/sources/tar_index.h"

namespace batchdist::worker {

/// A sample that could not be read; what() names the file (member, offset) and why.
class SampleError : public Error {
 public:
  using Error::Error;
};

/// A file that could not be used, and why (report.json's data_errors).
struct DataErrorRecord {
  std::string where;
  std::string reason;
  int64_t index = -1;  ///< the sample it is in the source it was met in; -1: found by a walk
};

class Source {
 public:
  virtual ~Source() = default;
  virtual int64_t size() const = 0;
  /// The encoded bytes of sample `i` (one pread). Throws SampleError.
  virtual void read(int64_t i, std::string* bytes) const = 0;
  /// Where sample `i` lives, for messages: a path, or "shard.tar: member m at offset o".
  virtual std::string where(int64_t i) const = 0;
  /// The source's samples `rows` (in that order), sharing its files.
  std::shared_ptr<const Source> subset(std::vector<int64_t> rows) const;
  /// Total bytes of the encoded samples, when known without reading them (else -1).
  virtual int64_t encodedBytes() const { return -1; }

  /// Every Source is made through this (subset() needs to share ownership of its base).
  template <typename T>
  static std::shared_ptr<const Source> own(std::shared_ptr<T> s) {
    s->self_ = s;
    return s;
  }

 private:
  std::weak_ptr<const Source> self_;
};

/// Image files under `root` (ImageEntry paths are relative to it).
std::shared_ptr<const Source> imageFileSource(std::string root, std::vector<ImageEntry> entries);

/// The samples of indexed tar shards, in shard order.
std::shared_ptr<const Source> tarSource(std::vector<TarShard> shards);

}  // namespace batchdist::worker
