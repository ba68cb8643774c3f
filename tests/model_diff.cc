// model_diff A.pt B.pt TOLERANCE: compares every parameter and buffer of two
// model.pt files written by batchdist (built-in models: a torch::serialize
// archive, i.e. a TorchScript module). Prints the largest absolute difference and
// exits 0 when it is <= TOLERANCE (0: bitwise equal), 1 otherwise, 2 when the files
// cannot be compared (other tensors, other shapes).

#include <torch/script.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <string>

#include "common/stdlib_guard.h"

namespace {

std::map<std::string, at::Tensor> stateOf(const std::string& path) {
  auto m = torch::jit::load(path, at::kCPU);
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters(/*recurse=*/true)) out["param " + p.name] = p.value;
  for (const auto& b : m.named_buffers(/*recurse=*/true)) out["buffer " + b.name] = b.value;
  for (const auto& a : m.named_attributes(/*recurse=*/true)) {
    if (a.value.isTensor() && !out.count("param " + a.name) && !out.count("buffer " + a.name)) {
      out["tensor " + a.name] = a.value.toTensor();
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  batchdist::ensureSystemStdlib();  // Note [libstdc++ first]
  if (argc != 4) {
    std::cerr << "usage: model_diff A.pt B.pt TOLERANCE\n";
    return 2;
  }
  const double tol = std::atof(argv[3]);
  try {
    const auto a = stateOf(argv[1]);
    const auto b = stateOf(argv[2]);
    if (a.size() != b.size() || a.empty()) {
      std::cerr << "model_diff: " << a.size() << " tensors in " << argv[1] << ", " << b.size()
                << " in " << argv[2] << "\n";
      return 2;
    }
    double worst = 0;
    std::string worst_name;
    int64_t unequal = 0;
    for (const auto& [name, t] : a) {
      const auto it = b.find(name);
      if (it == b.end() || !t.sizes().equals(it->second.sizes())) {
        std::cerr << "model_diff: " << name << " missing or of another shape in " << argv[2] << "\n";
        return 2;
      }
      if (!torch::equal(t, it->second)) ++unequal;
      if (!t.is_floating_point()) continue;
      const double d = (t.to(at::kDouble) - it->second.to(at::kDouble)).abs().max().item<double>();
      if (d > worst) {
        worst = d;
        worst_name = name;
      }
    }
    std::cout << "model_diff: " << a.size() << " tensors, " << unequal
              << " not bitwise equal, max |a-b| = " << worst
              << (worst_name.empty() ? "" : " (" + worst_name + ")") << ", tolerance " << tol
              << "\n";
    if (tol == 0) return unequal == 0 ? 0 : 1;
    return worst <= tol ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "model_diff: " << e.what() << "\n";
    return 2;
  }
}
