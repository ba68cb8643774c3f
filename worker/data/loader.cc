#include "worker/data/loader.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <chrono>

#include "collective/error.h"
#include "worker/common/util.h"
#include "collective/torch_compat.h"

namespace batchdist::worker {
Transform Transform::fromConfig(const DataConfig& cfg, bool training) {
  Transform t;
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
  return x.contiguous();
}

Loader::Loader(const Dataset& data, LoaderOptions opts) : data_(data), opts_(std::move(opts)) {
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
    // A new epoch waits for the workers to finish the last one's jobs.
    jobs_ = std::move(jobs);
    epoch_ = epoch;
    first_index_ = first_index;
    ++generation_;
    next_job_ = 0;
    consumed_ = 0;
    ready_.clear();
    errors_.clear();  // a failure belongs to the job list it happened in
  }
  cv_.notify_all();
}

Batch Loader::make(const MicroBatch& job, int64_t index, int64_t epoch) const {
  Batch b;
  auto idx = at::tensor(job.indices, at::kLong);
  b.x = data_.x.index_select(0, idx).to(at::kFloat);
  if (data_.x_scale != 1.0) b.x.mul_(data_.x_scale);
  b.y = data_.y.index_select(0, idx);
  b.w = at::tensor(job.weights, at::kFloat);
  const uint64_t seed = opts_.seed * 1000003ull + static_cast<uint64_t>(epoch) * 7919ull +
                        static_cast<uint64_t>(index);
  if (!opts_.device.is_cuda() && opts_.transform.any()) {
    b.x = opts_.transform.apply(b.x, seed);  // CPU training: in the worker, off the step
  }
  if (opts_.device.is_cuda() && opts_.pin_memory) {
    b.x = b.x.pin_memory();
    b.y = b.y.pin_memory();
    b.w = b.w.pin_memory();
  }
  return b;
}

Batch Loader::toDevice(Batch host) const {
  if (!opts_.device.is_cuda()) return host;
  Batch d;
  d.x = compat::copyToDeviceAsync(host.x, opts_.device);
  d.y = compat::copyToDeviceAsync(host.y, opts_.device);
  d.w = compat::copyToDeviceAsync(host.w, opts_.device);
  return d;
}

void Loader::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // Take a job only while the queue (made but not consumed) is below prefetch.
    cv_.wait(lock, [this] {
      return stop_ || (next_job_ < static_cast<int64_t>(jobs_.size()) &&
                       next_job_ < consumed_ + opts_.prefetch);
    });
    if (stop_) return;
    const int64_t i = next_job_++;
    const int64_t generation = generation_;
    const int64_t epoch = epoch_;  // read under the lock: start() writes it
    const int64_t first = first_index_;
    const MicroBatch job = jobs_[i];
    lock.unlock();
    Batch b;
    std::exception_ptr err;
    try {
      b = make(job, first + i, epoch);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    if (generation != generation_) continue;  // start() moved on meanwhile
    if (err) errors_[i] = err;
    ready_[i] = std::move(b);
    max_queued_ = std::max<int64_t>(max_queued_, static_cast<int64_t>(ready_.size()));
    cv_.notify_all();
  }
}

Batch Loader::next() {
  const double t0 = monotonicSeconds();
  Batch b;
  int64_t index = 0;
  int64_t epoch = 0;
  if (threads_.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (consumed_ >= static_cast<int64_t>(jobs_.size())) {
      throw Error("loader: next() past the end of the epoch");
    }
    index = consumed_++;
    epoch = epoch_;
    b = make(jobs_[index], first_index_ + index, epoch);
    index += first_index_;
    max_queued_ = std::max<int64_t>(max_queued_, 1);
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
  b = toDevice(std::move(b));
  if (opts_.device.is_cuda() && opts_.transform.any()) {
    const uint64_t seed = opts_.seed * 1000003ull + static_cast<uint64_t>(epoch) * 7919ull +
                          static_cast<uint64_t>(index);
    b.x = opts_.transform.apply(b.x, seed);  // on the GPU
  }
  return b;
}

double Loader::takeWaitSeconds() {
  const double w = wait_s_;
  wait_s_ = 0;
  return w;
}

}  // namespace batchdist::worker
