#pragma once
// The contract the config loader is fuzzed against, shared by the libFuzzer
// target (tests/fuzz/config_fuzzer.cc) and the seeded mutation test that always
// runs in ctest (tests/config_fuzz_test.cc): for ANY text and any --set list,
// parseConfig either returns a Config whose resolved form serialises (the report
// and the cross-rank check dump it), or throws batchdist::ConfigError. Any other
// exception, a crash or a hang is a bug.

#include <nlohmann/json.hpp>

#include <exception>
#include <string>
#include <typeinfo>
#include <vector>

#include "common/error.h"
#include "worker/config/config.h"

namespace batchdist::fuzz {

/// --set lists every input is also tried with: a plausible one, one naming an
/// unknown section, and one built from the input's last line (so the fuzzer
/// reaches the --set parser too).
inline std::vector<std::vector<std::string>> overrideSets(const std::string& text) {
  std::vector<std::vector<std::string>> sets{
      {},
      {"batch.global=64", "model.hidden=[8, 4]", "batch.per_gpu=auto", "train.max_steps=2"},
      {"foo.x=1"},
  };
  const auto nl = text.find_last_of('\n');
  if (nl != std::string::npos && nl + 1 < text.size()) {
    sets.push_back({text.substr(nl + 1)});
    sets.push_back({"data.path=" + text.substr(nl + 1)});
  }
  return sets;
}

/// "" when parseConfig(text, ..., overrides) kept the contract, otherwise what it
/// did. `*parsed` (if given) says whether it returned a Config.
inline std::string checkOne(const std::string& text, const std::vector<std::string>& overrides,
                            bool* parsed = nullptr) {
  if (parsed) *parsed = false;
  try {
    const auto cfg = worker::parseConfig(text, "fuzz.yaml", overrides);
    (void)cfg.resolved.dump();
    if (parsed) *parsed = true;
  } catch (const ConfigError&) {
    return "";
  } catch (const std::exception& e) {
    return std::string("threw ") + typeid(e).name() + ": " + e.what();
  } catch (...) {
    return "threw a non-std exception";
  }
  return "";
}

/// checkOne over every override set; the first violation, or "". `*parsed` (if
/// given): whether the text alone (no overrides) parsed.
inline std::string checkInput(const std::string& text, bool* parsed = nullptr) {
  bool first = true;
  for (const auto& sets : overrideSets(text)) {
    auto problem = checkOne(text, sets, first ? parsed : nullptr);
    first = false;
    if (!problem.empty()) {
      std::string list;
      for (const auto& s : sets) list += (list.empty() ? "" : ", ") + ("'" + s + "'");
      return problem + " (overrides: [" + list + "])";
    }
  }
  return "";
}

}  // namespace batchdist::fuzz
