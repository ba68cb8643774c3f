#include "worker/data/loader.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <optional>
#include <tuple>

#include "common/error.h"
#include "common/trace.h"
#include "worker/common/util.h"
#include "collective/torch_compat.h"

namespace batchdist::worker {
Transform Transform::fromConfig(const DataConfig& cfg, bool training) {
  Transform t;
  if (cfg.name == DataName::kTokens) return t;  // token ids pass untouched (Note [tokens])
  if (cfg.decoded()) {  // crop, resize and flip are the decoder's (Note [decode less])
    t.mean = cfg.mean;
    t.std = cfg.std;
    return t;
  }
  if (training) {
    t.crop_padding = cfg.crop_padding;
    t.hflip = cfg.hflip;
  }
  t.resize = cfg.resize;
  t.mean = cfg.mean;
  t.std = cfg.std;
  return t;
}

std::vector<int64_t> Transform::outputShape(const std::vector<int64_t>& in) const {
  auto out = in;
  if (resize > 0 && out.size() == 3) out[1] = out[2] = resize;
  return out;
}

at::Tensor Transform::apply(const at::Tensor& input, uint64_t seed) const {
  at::Tensor x = input;
  const bool image = x.dim() == 4;
  if (image && randomOps()) {
    // The random parameters come from a seeded CPU generator, whatever the device.
    auto gen = at::detail::createCPUGenerator(seed);
    const int64_t n = x.size(0), h = x.size(2), w = x.size(3);
    if (crop_padding > 0) {
      const int64_t p = crop_padding;
      auto offsets = at::randint(2 * p + 1, {n, 2}, gen, at::kLong);
      auto padded = at::constant_pad_nd(x, {p, p, p, p}, 0);
      std::vector<at::Tensor> crops;
      crops.reserve(n);
      const auto* o = offsets.data_ptr<int64_t>();
      for (int64_t i = 0; i < n; ++i) {
        crops.push_back(padded[i].narrow(1, o[2 * i], h).narrow(2, o[2 * i + 1], w));
      }
      x = at::stack(crops);
    }
    if (hflip) {
      auto flip = (at::rand({n}, gen, at::kFloat) < 0.5).to(x.device()).view({n, 1, 1, 1});
      x = at::where(flip, x.flip({3}), x);
    }
  }
  if (image && resize > 0 && (x.size(2) != resize || x.size(3) != resize)) {
    x = at::upsample_bilinear2d(x, {resize, resize}, /*align_corners=*/false);
  }
  if (!mean.empty()) {
    const int64_t c = x.size(1);
    if (static_cast<int64_t>(mean.size()) != c) {
      throw ConfigError(strCat("data.mean: ", mean.size(), " values for ", c, " channels"));
    }
    std::vector<int64_t> shape(x.dim(), 1);
    shape[1] = c;
    auto m = at::tensor(mean, at::kFloat).to(x.device()).view(shape);
    auto s = at::tensor(std, at::kFloat).to(x.device()).view(shape);
    x = (x - m) / s;
  }
  return laidOut(x);
}

at::Tensor Transform::laidOut(const at::Tensor& x) const {
  if (channels_last && x.dim() == 4) return x.contiguous(at::MemoryFormat::ChannelsLast);
  return x.contiguous();
}

LoaderOptions loaderOptions(const DataConfig& cfg, const Dataset& data, bool training,
                            at::Device device, uint64_t seed, SampleDecoder::Warn warn,
                            int64_t read_delay_us) {
  LoaderOptions lo;
  lo.workers = resolveWorkers(cfg, static_cast<int>(std::thread::hardware_concurrency()), 1);
  lo.prefetch = cfg.prefetch;
  lo.pin_memory = cfg.pin_memory;
  lo.device = device;
  lo.transform = Transform::fromConfig(cfg, training);
  lo.seed = seed;
  if (data.source) {
    const int64_t cache = cfg.cache == DataCache::kRam ? cfg.cache_mb << 20 : 0;
    lo.decoder = std::make_shared<SampleDecoder>(data.source, ImageTransform::fromConfig(cfg, training),
                                                 cfg.on_error, seed, std::move(warn), cache,
                                                 read_delay_us);
  }
  return lo;
}

int64_t resolveWorkers(const DataConfig& cfg, int cpus, int local_ranks) {
  if (!cfg.workers_auto) return cfg.workers;
  if (!cfg.decoded()) return 0;
  return std::max<int64_t>(1, cpus / std::max(1, local_ranks) - 1);
}

namespace {

uint64_t batchSeed(uint64_t seed, int64_t epoch, int64_t index) {
  return seed * 1000003ull + static_cast<uint64_t>(epoch) * 7919ull + static_cast<uint64_t>(index);
}

/// uint8 NHWC images -> float [N, C, H, W] in [0, 1] (then the transform
/// normalises), laid out as `t` asks: channels last keeps the NHWC memory order
/// (the conversion preserves strides), so no transposing copy is made.
at::Tensor toFloatImages(const at::Tensor& x, const Transform& t) {
  return t.laidOut(x.permute({0, 3, 1, 2}).to(at::kFloat).mul_(1.0 / 255.0));
}

}  // namespace

struct Loader::Building {
  Batch b;
  int64_t parts_left = 0;
  std::exception_ptr err;
};

Loader::Loader(const Dataset& data, LoaderOptions opts) : data_(data), opts_(std::move(opts)) {
  if (data_.source && !opts_.decoder) throw Error("loader: a decoded source needs a decoder");
  for (int64_t i = 0; i < opts_.workers; ++i) threads_.emplace_back([this] { work(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void Loader::start(std::vector<MicroBatch> jobs, int64_t epoch, int64_t first_index) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_ = std::move(jobs);
    epoch_ = epoch;
    first_index_ = first_index;
    ++generation_;
    next_job_ = 0;
    next_part_ = 0;
    consumed_ = 0;
    ready_.clear();
    building_.clear();  // parts still being made finish into buffers nobody reads
    errors_.clear();    // a failure belongs to the job list it happened in
  }
  cv_.notify_all();
}

int64_t Loader::partsOf(const MicroBatch& job) const {
  if (!data_.source) return 1;
  const int64_t n = static_cast<int64_t>(job.indices.size());
  return std::max<int64_t>(1, (n + opts_.part_samples - 1) / opts_.part_samples);
}

Batch Loader::allocate(const MicroBatch& job) const {
  Batch b;
  const auto idx = at::tensor(job.indices, at::kLong);
  // Token windows: int64 ids, checked (Note [tokens]). A program's examples are
  // read in fill(), off the lock (Note [program data]).
  if (!data_.examples) b.target = data_.targets(idx);
  b.w = at::tensor(job.weights, at::kFloat);
  if (data_.source) {
    const int64_t n = static_cast<int64_t>(job.indices.size());
    const int64_t side = opts_.decoder->size();
    const bool pin = opts_.device.is_cuda() && opts_.pin_memory;
    // Note [channels last]: fill() writes float samples NHWC when asked (each
    // sample's slot is 3 side² floats either way).
    const auto format = opts_.transform.channels_last ? at::MemoryFormat::ChannelsLast
                                                      : at::MemoryFormat::Contiguous;
    b.x = floatImages() ? at::empty({n, 3, side, side}, at::TensorOptions().dtype(at::kFloat), format)
                        : at::empty({n, side, side, 3}, at::TensorOptions().dtype(at::kByte).pinned_memory(pin));
  }
  return b;
}

// Note [replacement's target]: with data.on_error skip, the sample decoded into
// a bad file's slot is another one (SampleDecoder::decode: the next good index), so
// the slot takes that sample's target too; allocate() filled the slot's target from
// the job's index before anything was decoded. Each slot is written by the one
// thread that fills its part.
void Loader::takeTarget(Batch* b, int64_t slot, int64_t index) const {
  b->target[slot].copy_(data_.target[index]);
}

bool Loader::floatImages() const {
  return data_.source && !opts_.device.is_cuda() && !opts_.uint8_images;
}

void Loader::fill(const MicroBatch& job, int64_t part, int64_t index, int64_t epoch, Batch* b) {
  if (data_.examples) {
    std::tie(b->x, b->target) = data_.batch(job.indices);
    return;
  }
  if (!data_.source) {
    b->x = data_.inputs(at::tensor(job.indices, at::kLong));  // float, or token ids
    return;
  }
  thread_local DecodeScratch scratch;
  StageSeconds seconds;
  const int64_t n = static_cast<int64_t>(job.indices.size());
  const int64_t begin = part * opts_.part_samples;
  const int64_t end = std::min(n, begin + opts_.part_samples);
  const int64_t slot = b->x.stride(0);
  if (!floatImages()) {
    auto* base = b->x.data_ptr<uint8_t>();
    for (int64_t k = begin; k < end; ++k) {
      const int64_t got = opts_.decoder->decode(job.indices[k], epoch, base + k * slot, &scratch, &seconds);
      if (got != job.indices[k]) takeTarget(b, k, got);
    }
  } else {
    // CPU training: each sample goes uint8 HWC -> normalised float CHW in one pass,
    // right after its decode, in this thread (Note [loader]).
    thread_local std::vector<uint8_t> hwc;
    const int64_t side = opts_.decoder->size(), plane = side * side;
    hwc.resize(static_cast<std::size_t>(plane * 3));
    float scale[3], shift[3];
    for (int c = 0; c < 3; ++c) {
      const bool norm = opts_.transform.mean.size() == 3;
      const double sd = norm ? opts_.transform.std[c] : 1.0, mu = norm ? opts_.transform.mean[c] : 0.0;
      scale[c] = static_cast<float>(1.0 / (255.0 * sd));
      shift[c] = static_cast<float>(-mu / sd);
    }
    auto* base = b->x.data_ptr<float>();
    for (int64_t k = begin; k < end; ++k) {
      const int64_t got = opts_.decoder->decode(job.indices[k], epoch, hwc.data(), &scratch, &seconds);
      if (got != job.indices[k]) takeTarget(b, k, got);
      const double t0 = monotonicSeconds();
      float* dst = base + k * slot;
      const uint8_t* src = hwc.data();
      if (opts_.transform.channels_last) {  // HWC as decoded
        for (int64_t e = 0; e < 3 * plane; e += 3) {
          for (int c = 0; c < 3; ++c) dst[e + c] = src[e + c] * scale[c] + shift[c];
        }
      } else {
        for (int64_t p = 0; p < plane; ++p, src += 3) {
          dst[p] = src[0] * scale[0] + shift[0];
          dst[plane + p] = src[1] * scale[1] + shift[1];
          dst[2 * plane + p] = src[2] * scale[2] + shift[2];
        }
      }
      seconds.transform += monotonicSeconds() - t0;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  stages_.add(seconds);
}

void Loader::finish(Batch* b, int64_t index, int64_t epoch) const {
  if (!opts_.device.is_cuda()) {
    if (data_.source) return;  // uint8 as asked, or already float (fill)
    // CPU training: transform here, in the worker, off the step.
    if (opts_.transform.any()) b->x = opts_.transform.apply(b->x, batchSeed(opts_.seed, epoch, index));
    else if (b->x.dim() == 4) b->x = opts_.transform.laidOut(b->x);
    return;
  }
  if (opts_.pin_memory) {
    if (!b->x.is_pinned()) b->x = b->x.pin_memory();
    b->target = b->target.pin_memory();
    b->w = b->w.pin_memory();
  }
}

Batch Loader::toDevice(Batch host) const {
  if (!opts_.device.is_cuda()) return host;
  Batch d;
  d.x = compat::copyToDeviceAsync(host.x, opts_.device);
  d.target = compat::copyToDeviceAsync(host.target, opts_.device);
  d.w = compat::copyToDeviceAsync(host.w, opts_.device);
  return d;
}

void Loader::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // Take work only while the batches begun and not consumed are below prefetch.
    cv_.wait(lock, [this] {
      return stop_ || (next_job_ < static_cast<int64_t>(jobs_.size()) &&
                       next_job_ < consumed_ + opts_.prefetch);
    });
    if (stop_) return;
    const int64_t i = next_job_;
    const int64_t generation = generation_;
    const int64_t epoch = epoch_;  // read under the lock: start() writes it
    const int64_t first = first_index_;
    const MicroBatch job = jobs_[i];
    const int64_t parts = partsOf(job);
    const int64_t part = next_part_++;
    if (next_part_ == parts) {
      next_part_ = 0;
      ++next_job_;
    }
    std::shared_ptr<Building> bld;
    std::exception_ptr err;
    if (part == 0) {
      bld = std::make_shared<Building>();
      bld->parts_left = parts;
      building_[i] = bld;
      try {
        bld->b = allocate(job);
      } catch (...) {
        err = std::current_exception();
      }
    } else {
      bld = building_.at(i);
    }
    lock.unlock();
    const double busy_from = monotonicSeconds();
    if (!err) {
      try {
        fill(job, part, first + i, epoch, &bld->b);
      } catch (...) {
        err = std::current_exception();
      }
    }
    lock.lock();
    busy_s_ += monotonicSeconds() - busy_from;
    if (generation != generation_) continue;  // start() moved on meanwhile
    if (err && !bld->err) bld->err = err;
    if (--bld->parts_left > 0) continue;
    building_.erase(i);
    if (!bld->err) {
      lock.unlock();
      const double finish_from = monotonicSeconds();
      try {
        finish(&bld->b, first + i, epoch);
      } catch (...) {
        bld->err = std::current_exception();
      }
      lock.lock();
      busy_s_ += monotonicSeconds() - finish_from;
      if (generation != generation_) continue;
    }
    if (bld->err) errors_[i] = bld->err;
    ready_[i] = std::move(bld->b);
    max_queued_ = std::max<int64_t>(max_queued_, static_cast<int64_t>(ready_.size()));
    cv_.notify_all();
  }
}

Batch Loader::next() {
  const double t0 = monotonicSeconds();
  Batch b;
  int64_t index = 0;
  int64_t epoch = 0;
  std::optional<trace::Range> waiting;  // Note [trace ranges]
  waiting.emplace("batchdist/data_wait");
  if (threads_.empty()) {
    MicroBatch job;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (consumed_ >= static_cast<int64_t>(jobs_.size())) {
        throw Error("loader: next() past the end of the epoch");
      }
      index = consumed_++;
      epoch = epoch_;
      job = jobs_[index];
      index += first_index_;
      max_queued_ = std::max<int64_t>(max_queued_, 1);
    }
    b = allocate(job);
    for (int64_t p = 0, parts = partsOf(job); p < parts; ++p) fill(job, p, index, epoch, &b);
    finish(&b, index, epoch);
  } else {
    std::unique_lock<std::mutex> lock(mu_);
    if (consumed_ >= static_cast<int64_t>(jobs_.size())) {
      throw Error("loader: next() past the end of the epoch");
    }
    cv_.wait(lock, [this] { return ready_.count(consumed_) > 0; });
    const int64_t local = consumed_;
    epoch = epoch_;
    index = first_index_ + local;  // the transform seed's index (CUDA path below)
    b = std::move(ready_[consumed_]);
    ready_.erase(consumed_++);
    cv_.notify_all();
    // A job's failure is reported when its turn comes, once: the next job (or the
    // next start()) is unaffected.
    if (const auto it = errors_.find(local); it != errors_.end()) {
      const auto err = it->second;
      errors_.erase(it);
      std::rethrow_exception(err);
    }
  }
  wait_s_ += monotonicSeconds() - t0;
  waiting.reset();
  if (!opts_.device.is_cuda()) return b;
  {
    trace::Range copy("batchdist/host_to_device");
    b = toDevice(std::move(b));
  }
  if (data_.source) b.x = toFloatImages(b.x, opts_.transform);  // on the GPU, after the uint8 copy
  if (opts_.transform.any()) b.x = opts_.transform.apply(b.x, batchSeed(opts_.seed, epoch, index));
  else if (!data_.source && b.x.dim() == 4) b.x = opts_.transform.laidOut(b.x);
  return b;
}

double Loader::busySeconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_s_;
}

StageSeconds Loader::stageSeconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stages_;
}

StageSeconds Loader::takeStageSeconds() {
  std::lock_guard<std::mutex> lock(mu_);
  const auto s = stages_;
  stages_ = StageSeconds{};
  return s;
}

double Loader::takeWaitSeconds() {
  const double w = wait_s_;
  wait_s_ = 0;
  return w;
}

}  // namespace batchdist::worker
