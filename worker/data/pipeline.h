#pragma once
// One sample of a decoded source: read its bytes, choose its crop (Note [sample
// seeds]), decode and resample straight into the batch's slot (Note [decode
// less]). Bad files are skipped or fatal (data.on_error), and counted. No LibTorch.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "worker/config/config.h"
#include "worker/data/crop.h"
#include "worker/data/source.h"

namespace batchdist::worker {

/// The crop and flip of one sample, for training or evaluation.
struct ImageTransform {
  int size = 224;                 ///< output side
  int resize = 256;               ///< eval: shorter side before the centre crop
  double scale_lo = 0.08, scale_hi = 1.0, ratio_lo = 0.75, ratio_hi = 4.0 / 3.0;
  bool training = true;           ///< RandomResizedCrop (+ flip) vs resize + centre crop
  bool hflip = true;

  static ImageTransform fromConfig(const DataConfig& cfg, bool training);
};

/// Seconds per stage, summed over samples (the `data` verb's split).
struct StageSeconds {
  double read = 0, decode = 0, transform = 0;
  int64_t samples = 0, bytes = 0;
  void add(const StageSeconds& o) {
    read += o.read, decode += o.decode, transform += o.transform;
    samples += o.samples, bytes += o.bytes;
  }
};

/// Decodes samples of one source; safe to call from several threads (each with
/// its own DecodeScratch).
class SampleDecoder {
 public:
  using Warn = std::function<void(const std::string&)>;
  /// `cache_bytes` > 0: data.cache ram, keep the encoded bytes of samples read
  /// (each once) while their total stays within it. `read_delay_us` > 0: every
  /// read from the source takes that much longer (Note [fault plan]: the tests'
  /// slow storage, BATCHDIST_FAULT_SLOW_READ_US; counted as read time).
  SampleDecoder(std::shared_ptr<const Source> source, ImageTransform transform, OnError on_error,
                uint64_t seed, Warn warn, int64_t cache_bytes = 0, int64_t read_delay_us = 0);

  /// Writes sample `index` of `epoch` (size x size x 3 uint8, HWC) to `out`. With
  /// on_error skip, an unreadable or undecodable sample is replaced by the next
  /// good one (index + 1, + 2, ... wrapping): the same on every run and rank.
  /// Returns the index of the sample decoded: `index`, or with on_error skip the
  /// next good one that took a bad file's place (Note [replacement's target]).
  /// Throws SampleError with on_error fail, or when no sample decodes.
  int64_t decode(int64_t index, int64_t epoch, uint8_t* out, DecodeScratch* scratch,
              StageSeconds* seconds) const;

  int size() const { return transform_.size; }
  /// Bad samples met so far (each counted once) and the first few of them.
  int64_t errorCount() const;
  std::vector<DataErrorRecord> firstErrors() const;
  /// Bytes held by the RAM cache, and the reads it answered.
  int64_t cachedBytes() const;
  int64_t cacheHits() const;
  /// The bad samples' indices met so far, sorted.
  std::vector<int64_t> badIndices() const;

 private:
  /// Decodes `index` once; returns false (after recording it) if it is bad.
  bool tryDecode(int64_t index, int64_t epoch, uint8_t* out, DecodeScratch* scratch,
                 StageSeconds* seconds) const;

  std::shared_ptr<const Source> source_;
  ImageTransform transform_;
  OnError on_error_;
  uint64_t seed_;
  Warn warn_;
  int64_t cache_limit_ = 0;
  int64_t read_delay_us_ = 0;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<int64_t, std::shared_ptr<const std::string>> cache_;
  mutable int64_t cache_bytes_ = 0;
  mutable int64_t cache_hits_ = 0;
  mutable std::mutex mu_;
  mutable std::set<int64_t> bad_;  // indices known to be bad (warned once)
  mutable std::vector<DataErrorRecord> first_;
};

/// How many of the first bad files a report lists.
constexpr std::size_t kErrorsListed = 10;

/// Note [bad files named]: report.json's data_errors lists the bad files of every
/// rank, not only rank 0's. `found` (a walk's, the same on every rank) first, then
/// the ranks' first few taken in turn (rank 0's first, rank 1's first, ..., rank
/// 0's second, ...), so a file only rank 3 met is named too; each file once, at
/// most `limit`.
std::vector<DataErrorRecord> mergeDataErrors(const std::vector<DataErrorRecord>& found,
                                             const std::vector<std::vector<DataErrorRecord>>& per_rank,
                                             std::size_t limit = kErrorsListed);

}  // namespace batchdist::worker
