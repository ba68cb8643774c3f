#pragma once
// What parseConfig says of a YAML text: the ConfigError's message (the file,
// the key and why), or "<no error>" when it parses. Shared by the tests of the
// config's refusals.

#include <string>

#include "common/error.h"
#include "worker/config/config.h"

namespace batchdist::testsupport {

inline std::string configError(const std::string& yaml) {
  try {
    worker::parseConfig(yaml, "test.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace batchdist::testsupport
