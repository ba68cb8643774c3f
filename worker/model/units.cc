#include "worker/model/units.h"

#include <algorithm>
#include <set>

namespace batchdist::worker {

int64_t unitWorkingBytes(const std::vector<ParamUnit>& units, bool reshard_after_forward) {
  const auto bytes = [&](const std::set<std::size_t>& ks) {
    int64_t b = 0;
    for (const auto k : ks) {
      for (const auto& p : units[k].params) b += p.numel() * static_cast<int64_t>(p.element_size());
    }
    return b;
  };
  std::set<std::size_t> all;
  for (std::size_t k = 0; k < units.size(); ++k) all.insert(k);
  if (!reshard_after_forward || units.size() < 2) return bytes(all);
  int64_t most = 0;
  for (std::size_t k = 0; k + 1 < units.size(); ++k) {
    std::set<std::size_t> pair{k, k + 1};
    for (const auto j : {k, k + 1}) pair.insert(units[j].uses.begin(), units[j].uses.end());
    most = std::max(most, bytes(pair));
  }
  return most;
}

at::Tensor runUnit(UnitHooks* hooks, std::size_t k,
                   const std::function<at::Tensor(const at::Tensor&)>& f, const at::Tensor& x) {
  if (hooks == nullptr) return f(x);
  hooks->beforeUnit(k);
  auto y = f(x);
  hooks->afterUnit(k, y);
  return y;
}

}  // namespace batchdist::worker
