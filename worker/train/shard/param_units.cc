#include "worker/train/shard/param_units.h"

#include <c10/core/DeviceGuard.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <utility>

#include "common/error.h"
#include "common/trace.h"

namespace batchdist::worker {
namespace {

/// The storage under `t` without its memory (Note [parameter units]): views keep
/// their sizes and offsets, and no memory.
void freeStorage(const at::Tensor& t) {
  auto* impl = t.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  impl->set_nbytes(0);
}

/// Memory under `t`'s storage again, from its own allocator (contents undefined).
void allocateStorage(const at::Tensor& t) {
  const c10::OptionalDeviceGuard on(t.device());
  const auto bytes = static_cast<std::size_t>(t.numel()) * t.element_size();
  auto* impl = t.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(impl->allocator()->allocate(bytes));
  impl->set_nbytes(bytes);
}

}  // namespace

ParamUnits::ParamUnits(collective::Communicator& comm, const std::vector<at::Tensor>& params,
                       std::vector<ParamUnit> units, bool reshard_after_forward, bool prefetch)
    : comm_(comm), units_(std::move(units)), reshard_(reshard_after_forward), prefetch_(prefetch) {
  std::vector<int64_t> numels;
  for (const auto& p : params) numels.push_back(p.numel());
  layout_ = makeUnitShardLayout(numels, comm.size(), unitEnds(params));
  torch::NoGradGuard no_grad;
  const auto options = params.front().options().requires_grad(false);
  owned_ = torch::zeros({layout_.slice}, options);
  for (std::size_t k = 0; k < layout_.segments.size(); ++k) {
    const auto& s = layout_.segments[k];
    full_.push_back(torch::zeros({s.chunk * layout_.ranks}, options));
    for (int64_t i = s.first; i < s.end; ++i) {
      auto p = params[static_cast<std::size_t>(i)];
      auto range = full_[k].narrow(0, layout_.starts[static_cast<std::size_t>(i)] - s.base, p.numel());
      range.copy_(p.detach().reshape({-1}));
      p.set_data(range.view(p.sizes()));  // the same parameter, its elements in the unit's buffer
    }
    keepChunk(k);
    live_.push_back(s.chunk > 0);
    pending_.emplace_back();
    if (s.chunk > 0) {
      ++live_count_;
      live_bytes_ += static_cast<int64_t>(full_[k].nbytes());
      release(k);
    }
  }
  resetPeak();
}

ParamUnits::~ParamUnits() {
  for (auto& w : pending_) {
    try {
      if (w) w->wait();  // a gather in flight writes into a unit's memory
    } catch (...) {  // NOLINT(bugprone-empty-catch): the communicator said why; nothing to add
    }
  }
}

std::vector<int64_t> ParamUnits::unitEnds(const std::vector<at::Tensor>& params) const {
  std::map<const c10::TensorImpl*, int64_t> index;
  for (std::size_t i = 0; i < params.size(); ++i) {
    index[params[i].unsafeGetTensorImpl()] = static_cast<int64_t>(i);
  }
  std::vector<int64_t> ends;
  int64_t next = 0;
  for (const auto& u : units_) {
    for (const auto& p : u.params) {
      const auto it = index.find(p.unsafeGetTensorImpl());
      if (it == index.end()) continue;  // frozen (Note [frozen parameters]): stays whole
      BATCHDIST_ENFORCE_OP(Error, it->second, ==, next, "unit '", u.name, "': its parameters are "
                           "not the next ones in the model's order (Note [parameter units])");
      ++next;
    }
    ends.push_back(next);
  }
  BATCHDIST_ENFORCE_OP(Error, next, ==, static_cast<int64_t>(params.size()),
                       "the model's units do not cover its trainable parameters (Note [parameter units])");
  return ends;
}

void ParamUnits::allocate(std::size_t k) {
  live_[k] = true;
  allocateStorage(full_[k]);
  ++gathers_;
  ++live_count_;
  live_bytes_ += static_cast<int64_t>(full_[k].nbytes());
  if (depth_ > 0) return;  // the peaks are the steps' (a whole-model scope is all of it)
  peak_live_ = std::max(peak_live_, live_count_);
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
}

void ParamUnits::gather(std::size_t k) {
  if (pending_[k]) {  // prefetched: wait for it
    auto work = std::move(pending_[k]);
    work->wait();
    return;
  }
  if (live_[k]) return;
  const auto& s = layout_.segments[k];
  if (s.chunk == 0) {
    live_[k] = true;
    return;
  }
  allocate(k);
  comm_.allgatherInto(owned_.narrow(0, s.owned, s.chunk), full_[k]);
}

std::vector<std::size_t> ParamUnits::withUses(std::size_t k) const {
  std::vector<std::size_t> all{k};
  all.insert(all.end(), units_[k].uses.begin(), units_[k].uses.end());
  return all;
}

void ParamUnits::keepChunk(std::size_t k) {
  const auto& s = layout_.segments[k];
  owned_.narrow(0, s.owned, s.chunk).copy_(full_[k].narrow(0, comm_.rank() * s.chunk, s.chunk));
}

void ParamUnits::prefetch(std::size_t k) {
  for (const std::size_t u : withUses(k)) {
    const auto& s = layout_.segments[u];
    if (live_[u] || s.chunk == 0) continue;
    allocate(u);
    ++prefetched_;
    pending_[u] = comm_.allgatherIntoAsync(owned_.narrow(0, s.owned, s.chunk), full_[u]);
    if (trace::on()) pending_[u]->trace(strCat("batchdist/all_gather unit ", units_[u].name));
  }
}

void ParamUnits::enter(std::size_t k, bool forward) {
  gatherWithUses(k);
  if (!prefetch_) return;
  if (forward && k + 1 < units_.size()) prefetch(k + 1);
  if (!forward && k > 0) prefetch(k - 1);
}

void ParamUnits::release(std::size_t k) {
  if (pending_[k]) {  // never free memory a gather is writing
    auto work = std::move(pending_[k]);
    work->wait();
  }
  if (!live_[k]) return;
  live_[k] = false;
  if (layout_.segments[k].chunk == 0) return;
  live_bytes_ -= static_cast<int64_t>(full_[k].nbytes());
  --live_count_;
  freeStorage(full_[k]);
}

void ParamUnits::gatherWithUses(std::size_t k) {
  for (const std::size_t u : withUses(k)) gather(u);
}

void ParamUnits::releaseWithUses(std::size_t k) {
  for (const std::size_t u : withUses(k)) release(u);
}

void ParamUnits::beforeUnit(std::size_t k) {
  if (fail_before_ == static_cast<int64_t>(k)) {
    fail_before_ = -1;
    throw c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                "out of memory (injected by BATCHDIST_FAULT_OOM in forward)");
  }
  if (depth_ == 0) enter(k, /*forward=*/true);
}

void ParamUnits::afterUnit(std::size_t k, const at::Tensor& y) {
  if (depth_ > 0) return;
  const bool backward = at::GradMode::is_enabled() && y.requires_grad();
  if (backward) {
    // Runs when y's gradient is complete: just before the unit's own backward.
    y.register_hook([this, k](const at::Tensor&) {
      if (depth_ == 0) enter(k, /*forward=*/false);
    });
  }
  if (reshard_ || !backward) releaseWithUses(k);
}

void ParamUnits::gatherAll() {
  if (depth_++ > 0) return;
  try {
    for (std::size_t k = 0; k < full_.size(); ++k) gather(k);
  } catch (...) {
    --depth_;  // the hooks work again; the unit hooks gather what they need
    throw;
  }
}

void ParamUnits::releaseAll(bool absorb_writes) {
  absorb_ = absorb_ || absorb_writes;  // an inner scope's restore is the outer one's too
  if (depth_ == 0 || --depth_ > 0) return;
  absorb_writes = absorb_;
  absorb_ = false;
  torch::NoGradGuard no_grad;
  for (std::size_t k = 0; k < full_.size(); ++k) {
    if (absorb_writes && live_[k] && layout_.segments[k].chunk > 0) keepChunk(k);
    release(k);
  }
}

void ParamUnits::gradientsIn(std::size_t k) {
  if (depth_ == 0) release(k);
}

void ParamUnits::endBackward() {
  if (depth_ > 0) return;
  for (std::size_t k = 0; k < full_.size(); ++k) release(k);
}

}  // namespace batchdist::worker
