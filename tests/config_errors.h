#pragma once
// What a call says when it refuses: parseConfig's ConfigError for a YAML text
// (the file, the key and why), or any call's error, or "<no error>". Shared by
// the tests of refusals.

#include <string>

#include "common/error.h"
#include "worker/config/config.h"

namespace batchdist::testsupport {

/// The message of the E that f() throws, or "<no error>" when it returns.
template <typename E = Error, typename F>
std::string errorOf(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "<no error>";
}

inline std::string configError(const std::string& yaml) {
  try {
    worker::parseConfig(yaml, "test.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace batchdist::testsupport
