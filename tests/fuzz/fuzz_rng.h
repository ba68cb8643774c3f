#pragma once
// The deterministic fuzz tests' generator (config_fuzz_test.cc, data_fuzz_test.cc).

#include <cstddef>
#include <cstdint>

namespace batchdist::fuzz {

/// splitmix64: a tiny PRNG whose sequence is the same on every platform (the
/// standard distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform-enough in [0, n) for n > 0.
  std::size_t below(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(next() % n); }
  template <typename T, std::size_t N>
  const T& pick(const T (&a)[N]) {
    return a[below(N)];
  }

 private:
  uint64_t s_;
};

}  // namespace batchdist::fuzz
