#include "worker/data/pipeline.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace batchdist::worker {
namespace {

/// A thread's decode buffer above this is released after the image that needed it.
constexpr std::size_t kScratchKeptBytes = std::size_t{64} << 20;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

ImageTransform ImageTransform::fromConfig(const DataConfig& cfg, bool training) {
  ImageTransform t;
  t.size = static_cast<int>(cfg.image_size);
  t.resize = static_cast<int>(cfg.resize > 0 ? cfg.resize : cfg.image_size);
  t.scale_lo = cfg.crop_scale.at(0);
  t.scale_hi = cfg.crop_scale.at(1);
  t.ratio_lo = cfg.crop_ratio.at(0);
  t.ratio_hi = cfg.crop_ratio.at(1);
  t.training = training;
  t.hflip = training && cfg.hflip;
  return t;
}

SampleDecoder::SampleDecoder(std::shared_ptr<const Source> source, ImageTransform transform,
                             OnError on_error, uint64_t seed, Warn warn, int64_t cache_bytes,
                             int64_t read_delay_us)
    : source_(std::move(source)),
      transform_(transform),
      on_error_(on_error),
      seed_(seed),
      warn_(std::move(warn)),
      cache_limit_(cache_bytes),
      read_delay_us_(read_delay_us) {}

int64_t SampleDecoder::cachedBytes() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  return cache_bytes_;
}

int64_t SampleDecoder::cacheHits() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  return cache_hits_;
}

bool SampleDecoder::tryDecode(int64_t index, int64_t epoch, uint8_t* out, DecodeScratch* scratch,
                              StageSeconds* seconds) const {
  thread_local std::string read_buffer;
  std::shared_ptr<const std::string> cached;
  std::string reason;
  try {
    const double t0 = now();
    if (cache_limit_ > 0) {
      std::lock_guard<std::mutex> lock(cache_mu_);
      if (const auto it = cache_.find(index); it != cache_.end()) {
        cached = it->second;
        ++cache_hits_;
      }
    }
    if (!cached) {
      if (read_delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(read_delay_us_));
      source_->read(index, &read_buffer);
      if (cache_limit_ > 0) {
        std::lock_guard<std::mutex> lock(cache_mu_);
        const auto size = static_cast<int64_t>(read_buffer.size());
        if (cache_bytes_ + size <= cache_limit_ && !cache_.count(index)) {
          cache_[index] = std::make_shared<const std::string>(read_buffer);
          cache_bytes_ += size;
        }
      }
    }
    const std::string& bytes = cached ? *cached : read_buffer;
    const double t1 = now();
    SampleRng rng(seed_, epoch, index);
    // The flip is drawn first, so the crop's draws do not depend on the image's size.
    const bool flip = transform_.hflip && (rng.next() >> 63) != 0;
    const auto& t = transform_;
    const BoxChooser choose = [&](int w, int h) {
      return t.training ? randomResizedCrop(w, h, t.scale_lo, t.scale_hi, t.ratio_lo, t.ratio_hi, rng)
                        : resizeCenterCrop(w, h, t.resize, t.size);
    };
    DecodeTimes times;
    struct KeepScratchSmall {  // one huge image must not hold its buffer for the run
      DecodeScratch* s;
      ~KeepScratchSmall() {
        if (s->rgb.capacity() > kScratchKeptBytes) std::vector<uint8_t>().swap(s->rgb);
      }
    } keep{scratch};
    decodeCropResize(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), choose, t.size,
                     t.size, flip, out, scratch, seconds ? &times : nullptr);
    if (seconds) {
      seconds->read += t1 - t0;
      seconds->decode += times.decode;
      seconds->transform += times.transform;
      seconds->samples += 1;
      seconds->bytes += static_cast<int64_t>(bytes.size());
    }
    return true;
  } catch (const SampleError& e) {
    reason = e.what();  // already names the file
  } catch (const DecodeError& e) {
    reason = strCat(source_->where(index), ": ", e.what());
  }
  if (on_error_ == OnError::kFail) {
    throw SampleError(strCat(reason, " (data.on_error: fail; 'skip' replaces such files by the "
                                     "next good sample)"));
  }
  bool first_time = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first_time = bad_.insert(index).second;
    if (first_time && first_.size() < kErrorsListed) {
      first_.push_back({source_->where(index), reason, index});
    }
  }
  if (first_time && warn_) warn_(strCat("skipping ", reason, "; the next good sample takes its place"));
  return false;
}

int64_t SampleDecoder::decode(int64_t index, int64_t epoch, uint8_t* out, DecodeScratch* scratch,
                              StageSeconds* seconds) const {
  const int64_t n = source_->size();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = (index + k) % n;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (bad_.count(i)) continue;
    }
    if (tryDecode(i, epoch, out, scratch, seconds)) return i;
  }
  throw SampleError(strCat("none of the ", n, " samples could be decoded; the first: ",
                           firstErrors().empty() ? std::string("?") : firstErrors()[0].reason));
}

int64_t SampleDecoder::errorCount() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(bad_.size());
}

std::vector<int64_t> SampleDecoder::badIndices() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {bad_.begin(), bad_.end()};
}

std::vector<DataErrorRecord> SampleDecoder::firstErrors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return first_;
}

std::vector<DataErrorRecord> mergeDataErrors(const std::vector<DataErrorRecord>& found,
                                             const std::vector<std::vector<DataErrorRecord>>& per_rank,
                                             std::size_t limit) {
  std::vector<DataErrorRecord> out;
  std::set<std::string> named;
  const auto take = [&](const DataErrorRecord& e) {
    if (out.size() < limit && named.insert(e.where).second) out.push_back(e);
  };
  for (const auto& e : found) take(e);
  std::size_t longest = 0;
  for (const auto& r : per_rank) longest = std::max(longest, r.size());
  for (std::size_t k = 0; k < longest; ++k) {
    for (const auto& r : per_rank) {
      if (k < r.size()) take(r[k]);
    }
  }
  return out;
}

}  // namespace batchdist::worker
