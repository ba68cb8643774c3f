#include "worker/train/step/noise_scale.h"

#include <cmath>

namespace batchdist::worker {

bool NoiseScaleEstimator::add(double small_sq, double b_small, double big_sq, double b_big) {
  if (!(b_big > b_small) || !(b_small > 0) || !std::isfinite(small_sq) || !std::isfinite(big_sq)) {
    return false;
  }
  const double g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small);
  const double tr = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big);
  ema_g2_ = decay_ * ema_g2_ + (1 - decay_) * g2;
  ema_tr_ = decay_ * ema_tr_ + (1 - decay_) * tr;
  weight_ = decay_ * weight_ + (1 - decay_);
  window_g2_ += g2;
  window_tr_ += tr;
  ++window_steps_;
  ++steps_;
  return true;
}

double NoiseScaleEstimator::gradSq() const { return weight_ > 0 ? ema_g2_ / weight_ : 0.0; }
double NoiseScaleEstimator::trace() const { return weight_ > 0 ? ema_tr_ / weight_ : 0.0; }

double NoiseScaleEstimator::bSimple() const {
  return steps_ > 0 && ema_g2_ > 0 ? ema_tr_ / ema_g2_ : -1.0;
}

double NoiseScaleEstimator::windowBSimple() const {
  return window_steps_ > 0 && window_g2_ > 0 ? window_tr_ / window_g2_ : -1.0;
}

void NoiseScaleEstimator::resetWindow() {
  window_steps_ = 0;
  window_g2_ = window_tr_ = 0;
}

NoiseSample noiseSample(double local_sum, double summed, double scale, int64_t world,
                        int64_t per_rank) {
  const double s2 = scale * scale;
  NoiseSample n;
  n.small_sq = static_cast<double>(world) * local_sum / s2;
  n.big_sq = summed / s2;
  n.b_small = static_cast<double>(per_rank);
  n.b_big = static_cast<double>(world * per_rank);
  return n;
}

}  // namespace batchdist::worker
