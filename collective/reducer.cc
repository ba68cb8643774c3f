#include "collective/reducer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <utility>

#include "common/error.h"

namespace batchdist::collective {
namespace {

double steadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Reducer::Reducer(Communicator& comm, std::vector<at::Tensor> params, std::size_t bucket_bytes)
    : comm_(comm), params_(std::move(params)), bucket_bytes_(bucket_bytes), seen_(params_.size()) {
  // Initial order: reverse registration, roughly the order backward produces
  // gradients (Note [overlapped reducer]); rebuilt from the real order later.
  std::vector<std::size_t> order;
  for (std::size_t k = params_.size(); k-- > 0;) order.push_back(k);
  build(order);
  // Note [reducer hooks] (collective/grad_hooks.h): removed with the Reducer.
  hooks_ = std::make_unique<GradReadyHooks>(
      params_, [this](std::size_t i) { onGradReady(i); }, "reducer");
}

Reducer::~Reducer() = default;

void Reducer::build(const std::vector<std::size_t>& order) {
  // One open bucket per (dtype, device), filled in `order` up to bucket_bytes_.
  buckets_.clear();
  bucket_of_.assign(params_.size(), 0);
  std::map<std::pair<int, std::string>, std::size_t> open;
  std::vector<std::size_t> bytes;
  for (const std::size_t k : order) {
    const auto& p = params_[k];
    const auto key = std::make_pair(static_cast<int>(p.scalar_type()), p.device().str());
    const std::size_t nbytes = p.numel() * p.element_size();
    auto it = open.find(key);
    if (it == open.end() || (bytes[it->second] > 0 && bytes[it->second] + nbytes > bucket_bytes_)) {
      buckets_.emplace_back();
      bytes.push_back(0);
      it = open.insert_or_assign(key, buckets_.size() - 1).first;
    }
    buckets_[it->second].params.push_back(k);
    bucket_of_[k] = it->second;
    bytes[it->second] += nbytes;
  }
  if (buckets_.empty()) {
    // No parameter: a bucket of the tail alone (Note [side channel]).
    buckets_.emplace_back();
    buckets_.back().flat = at::zeros({tailLayout(0, comm_.size()).size},
                                     at::TensorOptions().dtype(at::kFloat).device(comm_.device()));
    return;
  }
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    auto& bucket = buckets_[b];
    const int64_t n = paramElements(bucket);
    // Note [side channel]: the last bucket's tail, with W arrival slots.
    const int64_t tail = b + 1 == buckets_.size() ? tailLayout(n, comm_.size()).size : 0;
    bucket.flat = at::zeros({n + tail}, params_[bucket.params.front()].options());
  }
  attachViews();
}

// Note [bucket view layout]: a parameter's gradient view in its bucket takes the
// parameter's strides, as autograd lays out a gradient it makes and as c10d's
// reducer lays out its bucket views: a channels-last weight (Note [channels
// last] in worker/model/model.h) gets a channels-last gradient, which the
// convolution's backward writes without a transposing copy. The bucket then
// holds the elements in the parameter's memory order; every reader of a bucket
// (the sum, the squared norms) is indifferent to the order.
static at::Tensor gradView(const at::Tensor& flat, int64_t offset, const at::Tensor& p) {
  if (p.is_contiguous() || !p.is_non_overlapping_and_dense()) {
    return flat.narrow(0, offset, p.numel()).view(p.sizes());
  }
  return flat.as_strided(p.sizes(), p.strides(), flat.storage_offset() + offset);
}

void Reducer::attachViews() {
  for (auto& bucket : buckets_) {
    int64_t offset = 0;
    for (auto k : bucket.params) {
      auto& p = params_[k];
      auto view = gradView(bucket.flat, offset, p);
      const auto& grad = p.grad();
      if (!grad.defined() || grad.data_ptr() != view.data_ptr()) {
        at::NoGradGuard no_grad;
        if (grad.defined()) view.copy_(grad);  // someone replaced it: keep its value
        p.mutable_grad() = view;
      }
      offset += p.numel();
    }
  }
}

void Reducer::zeroGrad() {
  step_started_ = steadySeconds();
  for (auto& bucket : buckets_) bucket.flat.zero_();
  attachViews();
}

void Reducer::rebuildInReadyOrder() {
  // Collective (one broadcast): every rank calls finish() at every step, so all
  // get here at the end of the same step. The summed gradients move into the
  // new buckets (attachViews copies), so the optimizer still sees them.
  rebuilt_ = true;
  // Note [ready order]: parameters that never became ready go last, in the
  // initial order (reverse registration).
  std::vector<std::size_t> initial;
  for (std::size_t k = params_.size(); k-- > 0;) initial.push_back(k);
  const auto order = agreeReadyOrder(comm_, ready_order_, initial);
  build(order);
}

void Reducer::prepare(bool final_micro, const SideChannel& side) {
  std::lock_guard<std::mutex> lock(mu_);
  final_ = final_micro;
  if (!final_micro) return;
  in_step_ = true;
  side_ = side;
  next_bucket_ = 0;
  local_sq_ = sqNormSum();
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.params.size();
    bucket.ready = false;
    bucket.work.reset();
  }
}

void Reducer::setSide(const SideChannel& side) {
  std::lock_guard<std::mutex> lock(mu_);
  side_ = side;  // written into the last bucket when finish() starts it
}

float* Reducer::hostTail() const {
  const auto& flat = buckets_.back().flat;
  if (!flat.device().is_cpu() || flat.scalar_type() != at::kFloat) return nullptr;
  return flat.data_ptr<float>() + paramElements(buckets_.back());
}

SideChannel Reducer::sumGradients(const SideChannel& side) {
  setSide(side);
  return finish();
}

TailLayout Reducer::tail() const { return tailLayout(paramElements(buckets_.back()), comm_.size()); }

at::Tensor Reducer::sideSlot() const { return buckets_.back().flat.narrow(0, tail().side, kSideSlots); }

at::Tensor Reducer::normSlot() const { return buckets_.back().flat.narrow(0, tail().norm, 1); }

at::Tensor Reducer::arrivalSlots() const {
  return buckets_.back().flat.narrow(0, tail().arrivals, comm_.size());
}

int64_t Reducer::paramElements(const Bucket& bucket) const {
  int64_t n = 0;
  for (auto k : bucket.params) n += params_[k].numel();
  return n;
}

void Reducer::stampArrival(Bucket& bucket) {
  if (&bucket != &buckets_.back()) return;
  const double now = steadySeconds() - step_started_;
  if (float* host = hostTail()) {  // Note [host tail]
    const auto t = tail();
    for (int64_t i = 0; i < kSideSlots; ++i) host[i] = static_cast<float>(side_[i]);
    float* slots = host + (t.arrivals - t.side);
    std::fill(slots, slots + comm_.size(), 0.0f);
    slots[comm_.rank()] = static_cast<float>(now);
    return;
  }
  auto side = sideSlot();
  for (int64_t i = 0; i < kSideSlots; ++i) side.narrow(0, i, 1).fill_(side_[i]);  // no host sync
  auto slots = arrivalSlots();
  slots.zero_();
  slots.narrow(0, comm_.rank(), 1).fill_(now);
}

void Reducer::onGradReady(std::size_t param) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!final_ || !in_step_) return;  // accumulation: nothing leaves this rank
  if (steps_ == 0 && !seen_[param]) {
    seen_[param] = true;
    ready_order_.push_back(param);
  }
  // Buckets in flight get a chance to move on (PendingWork::progress).
  for (std::size_t b = 0; b < next_bucket_; ++b) {
    if (buckets_[b].work) buckets_[b].work->progress();
  }
  auto& bucket = buckets_[bucket_of_[param]];
  if (bucket.pending > 0 && --bucket.pending == 0) {
    bucket.ready = true;
    startReadyBuckets(/*from_hook=*/true);
  }
}

void Reducer::startReadyBuckets(bool from_hook) {
  // In index order only: a ready bucket waits for the ones before it. The last
  // (the side channel's) waits for finish().
  const std::size_t end = from_hook ? buckets_.size() - 1 : buckets_.size();
  while (next_bucket_ < end && buckets_[next_bucket_].ready) {
    auto& bucket = buckets_[next_bucket_++];
    if (measure_) {
      // Final and not yet summed: this rank's own gradient (Note [gradient norms]).
      const int64_t n = paramElements(bucket);
      if (n > 0) local_sq_.add(bucket.flat.narrow(0, 0, n));
      if (&bucket == &buckets_.back()) {
        if (float* host = hostTail()) {
          const auto t = tail();
          host[t.norm - t.side] = static_cast<float>(local_sq_.on_host);
        } else {
          auto slot = normSlot();
          if (local_sq_.on_device.defined()) slot.copy_(local_sq_.on_device.reshape({1}));
          else slot.zero_();
        }
      }
    }
    stampArrival(bucket);
    ++started_total_;
    if (from_hook) ++started_from_hooks_;
    if (comm_.size() > 1) {
      bucket.work = comm_.allreduceAsync(bucket.flat, ReduceOp::kSum);
      if (trace::on()) bucket.work->trace(bucketTraceName("allreduce", next_bucket_ - 1, bucket.flat));
    }
  }
}

SideChannel Reducer::finish() {
  if (!in_step_) {
    // No final backward on this rank (it failed before, e.g. out of memory): it
    // still sends its buckets and its side channel, so no rank waits forever.
    const SideChannel side = side_;
    prepare(/*final_micro=*/true, side);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Parameters that got no gradient this step: their (zero) views are sent as they are.
    for (auto& bucket : buckets_) bucket.ready = true;
    startReadyBuckets(/*from_hook=*/false);
    in_step_ = false;
    final_ = false;
  }
  for (auto& bucket : buckets_) {
    if (bucket.work) bucket.work->wait();
    bucket.work.reset();
  }
  const std::vector<double> summed = summedTail();  // from the side channel on
  const auto t = tail();
  SideChannel side{};
  for (int64_t i = 0; i < kSideSlots; ++i) side[i] = summed[i];
  side_ = SideChannel{};
  const double* arrivals = summed.data() + (t.arrivals - t.side);
  double latest = 0;
  for (int r = 0; r < comm_.size(); ++r) latest = std::max(latest, arrivals[r]);
  last_skew_s_ = std::max(0.0, latest - arrivals[comm_.rank()]);
  norms_ = GradSqNorms{};
  if (measure_) norms_ = {summed[t.norm - t.side], summedSqNorm(), true};
  if (++steps_ == 1 && !rebuilt_) rebuildInReadyOrder();
  return side;
}

std::vector<double> Reducer::summedTail() const {
  const auto layout = tail();
  const int64_t n = layout.size;
  if (const float* host = hostTail()) return std::vector<double>(host, host + n);  // Note [host tail]
  const auto t = buckets_.back().flat.narrow(0, layout.side, n).to(at::kDouble).cpu();
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + n);
}

double Reducer::summedSqNorm() const {
  SqNormSum sum = sqNormSum();
  for (const auto& bucket : buckets_) {
    const int64_t n = paramElements(bucket);
    if (n > 0) sum.add(bucket.flat.narrow(0, 0, n));
  }
  return sum.value();
}

void Reducer::SqNormSum::add(const at::Tensor& g) {
  if (host) {
    on_host += at::dot(g, g).item<double>();  // Note [host tail]: no tensor sum, no stack
    return;
  }
  auto sq = at::dot(g, g).to(at::kDouble);
  on_device = on_device.defined() ? on_device + sq : sq;
}

double Reducer::SqNormSum::value() const {
  return host || !on_device.defined() ? on_host : on_device.item<double>();  // one device sync
}

}  // namespace batchdist::collective
