// libFuzzer target for the config loader (see tests/fuzz/README.md): any input
// must parse or throw ConfigError; anything else aborts, and libFuzzer saves the
// input as crash-<sha1>.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "config_fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto problem = batchdist::fuzz::checkInput(text);
  if (!problem.empty()) {
    std::fprintf(stderr, "config loader broke its contract: %s\n", problem.c_str());
    std::abort();
  }
  return 0;
}
