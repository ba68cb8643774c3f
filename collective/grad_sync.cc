#include "collective/grad_sync.h"

#include <ATen/ATen.h>

#include <map>
#include <memory>

#include "collective/reducer.h"

namespace batchdist::collective {

TailLayout tailLayout(int64_t param_elements, int64_t arrival_slots) {
  TailLayout t;
  t.side = param_elements;
  t.norm = t.side + kSideSlots;
  t.arrivals = t.norm + 1;
  t.size = kSideSlots + 1 + arrival_slots;
  return t;
}

std::unique_ptr<GradientSync> makeGradientSync(bool overlap, Communicator& comm,
                                               std::vector<at::Tensor> params,
                                               std::size_t bucket_bytes) {
  if (overlap) return std::make_unique<Reducer>(comm, std::move(params), bucket_bytes);
  return std::make_unique<GradientSynchronizer>(comm, std::move(params), bucket_bytes);
}

GradientSynchronizer::GradientSynchronizer(Communicator& comm, std::vector<at::Tensor> params,
                                           std::size_t bucket_bytes)
    : comm_(comm), params_(std::move(params)) {
  // Open bucket per (dtype, device), filled in reverse parameter order.
  std::map<std::pair<int, std::string>, std::size_t> open;
  std::vector<std::size_t> bytes;
  for (std::size_t k = params_.size(); k-- > 0;) {
    const auto& p = params_[k];
    const auto key = std::make_pair(static_cast<int>(p.scalar_type()), p.device().str());
    const std::size_t nbytes = p.numel() * p.element_size();
    auto it = open.find(key);
    if (it == open.end() || (bytes[it->second] > 0 && bytes[it->second] + nbytes > bucket_bytes)) {
      buckets_.push_back({});
      bytes.push_back(0);
      open[key] = buckets_.size() - 1;
      it = open.find(key);
    }
    buckets_[it->second].params.push_back(k);
    bytes[it->second] += nbytes;
  }
  if (buckets_.empty()) {
    // No trainable parameter: a bucket of the tail alone (Note [side channel]).
    buckets_.push_back({});
    buckets_.back().flat = at::zeros({tailLayout(0, 0).size},
                                     at::TensorOptions().dtype(at::kFloat).device(comm_.device()));
    return;
  }
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    auto& b = buckets_[i];
    const int64_t n = paramElements(b);
    // The last bucket carries the tail of Note [side channel].
    const int64_t tail = i + 1 == buckets_.size() ? tailLayout(n, 0).size : 0;
    b.flat = at::zeros({n + tail}, params_[b.params.front()].options());
  }
}

void GradientSynchronizer::zeroGrad() {
  for (auto& p : params_) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

void GradientSynchronizer::dropGrad() {
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
}

namespace {

/// Squared norm of a bucket's gradient elements, accumulated in double on the
/// device (no host sync).
at::Tensor squaredNorm(const at::Tensor& flat, int64_t elements) {
  auto g = flat.narrow(0, 0, elements);
  return at::dot(g, g).to(at::kDouble);
}

}  // namespace

int64_t GradientSynchronizer::paramElements(const Bucket& b) const {
  int64_t n = 0;
  for (auto k : b.params) n += params_[k].numel();
  return n;
}

SideChannel GradientSynchronizer::sumGradients(const SideChannel& side) {
  // Note [side channel]: [params][side][local norm] in the last bucket.
  auto& last = buckets_.back();
  const auto tail = tailLayout(paramElements(last), 0);
  auto side_slots = last.flat.narrow(0, tail.side, kSideSlots);
  for (int64_t i = 0; i < kSideSlots; ++i) side_slots.narrow(0, i, 1).fill_(side[i]);
  auto norm_slot = last.flat.narrow(0, tail.norm, 1);
  norm_slot.zero_();
  at::Tensor local;
  norms_ = GradSqNorms{};
  std::vector<std::unique_ptr<PendingWork>> pending;
  pending.reserve(buckets_.size());
  for (auto& b : buckets_) {
    int64_t offset = 0;
    for (auto k : b.params) {
      auto& p = params_[k];
      auto slot = b.flat.narrow(0, offset, p.numel());
      if (p.grad().defined()) {
        slot.copy_(p.grad().reshape({-1}));
      } else {
        slot.zero_();
      }
      offset += p.numel();
    }
    if (measure_ && offset > 0) {
      // This rank's own gradient, before it is summed (Note [gradient norms]).
      auto sq = squaredNorm(b.flat, offset);
      local = local.defined() ? local + sq : sq;
    }
    if (measure_ && &b == &last && local.defined()) norm_slot.copy_(local.reshape({1}));
    if (comm_.size() > 1) {
      pending.push_back(comm_.allreduceAsync(b.flat, ReduceOp::kSum));
      if (trace::on()) pending.back()->trace(bucketTraceName("allreduce", pending.size() - 1, b.flat));
    }
  }
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    if (!pending.empty()) pending[i]->wait();
    auto& b = buckets_[i];
    int64_t offset = 0;
    for (auto k : b.params) {
      auto& p = params_[k];
      auto slot = b.flat.narrow(0, offset, p.numel()).view(p.sizes());
      if (p.grad().defined()) {
        p.mutable_grad().copy_(slot);
      } else {
        p.mutable_grad() = slot.clone();
      }
      offset += p.numel();
    }
  }
  SideChannel summed_side{};
  {
    const auto sum = side_slots.to(at::kDouble).cpu();
    for (int64_t i = 0; i < kSideSlots; ++i) summed_side[i] = sum.data_ptr<double>()[i];
  }
  if (measure_) {
    at::Tensor summed = at::zeros({}, norm_slot.options().dtype(at::kDouble));
    for (const auto& b : buckets_) {
      const int64_t n = paramElements(b);
      if (n > 0) summed = summed + squaredNorm(b.flat, n);
    }
    const auto both = at::stack({norm_slot.to(at::kDouble).reshape({}), summed}).cpu();
    norms_ = {both[0].item<double>(), both[1].item<double>(), true};
  }
  return summed_side;
}

void broadcastCoalesced(Communicator& comm, const std::vector<at::Tensor>& tensors, int root) {
  if (comm.size() == 1 || tensors.empty()) return;
  std::map<int, std::vector<at::Tensor>> by_dtype;
  for (const auto& t : tensors) by_dtype[static_cast<int>(t.scalar_type())].push_back(t);
  for (auto& [dtype, group] : by_dtype) {
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : group) flat_parts.push_back(t.detach().reshape({-1}));
    auto flat = at::cat(flat_parts).to(comm.device());
    comm.broadcast(flat, root);
    int64_t offset = 0;
    for (auto& t : group) {
      at::NoGradGuard no_grad;
      t.detach().copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

}  // namespace batchdist::collective
