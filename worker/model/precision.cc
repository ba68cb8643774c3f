#include "worker/model/precision.h"

#include <ATen/ATen.h>

#include "common/error.h"
#include "collective/torch_compat.h"

namespace batchdist::worker {

void checkPrecision(Precision precision, const at::Device& device, const std::string& source) {
  if (precision == Precision::kFp16 && !device.is_cuda()) {
    throw keyError(source, "train.precision",
                   "fp16 autocast needs a CUDA device; on the CPU use bf16");
  }
}

AutocastScope::AutocastScope(const at::Device& device, Precision precision)
    : type_(device.type()) {
  if (precision == Precision::kFp32) return;
  compat::setAutocast(type_, true, precision == Precision::kBf16 ? at::kBFloat16 : at::kHalf);
  at::autocast::increment_nesting();
  active_ = true;
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::setAutocast(type_, false, type_ == at::kCUDA ? at::kHalf : at::kBFloat16);
}

LossScaler::LossScaler(double initial_scale, int64_t growth_interval, double backoff,
                       double growth)
    : scale_(initial_scale), growth_interval_(growth_interval), backoff_(backoff),
      growth_(growth) {}

bool LossScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ = std::max(1.0, scale_ * backoff_);
    tracker_ = 0;
    ++skipped_;
    return false;
  }
  if (++tracker_ >= growth_interval_) {
    scale_ *= growth_;
    tracker_ = 0;
  }
  return true;
}

bool unscaleOrSkip(LossScaler& scaler, const std::vector<at::Tensor>& params) {
  // One reduction and one device-to-host read for the whole model, not one per tensor.
  std::vector<at::Tensor> finite;
  for (const auto& p : params) {
    if (p.grad().defined()) finite.push_back(at::isfinite(p.grad()).all());
  }
  const bool found_inf = !finite.empty() && !at::stack(finite).all().item<bool>();
  const double scale = scaler.scale();
  if (!scaler.update(found_inf)) return false;
  at::NoGradGuard no_grad;
  for (const auto& p : params) {
    if (p.grad().defined()) p.grad().mul_(1.0 / scale);
  }
  return true;
}

}  // namespace batchdist::worker
