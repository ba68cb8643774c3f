#include "worker/model/units.h"

namespace batchdist::worker {

at::Tensor runUnit(UnitHooks* hooks, std::size_t k,
                   const std::function<at::Tensor(const at::Tensor&)>& f, const at::Tensor& x) {
  if (hooks == nullptr) return f(x);
  hooks->beforeUnit(k);
  auto y = f(x);
  hooks->afterUnit(k, y);
  return y;
}

}  // namespace batchdist::worker
