// The config loader under deterministic mutation, in every ctest run: the
// shipped configs plus tricky seeds (tests/fuzz/corpus/ and a few generated
// here), each mutated a few thousand times with byte flips, YAML punctuation,
// line swaps and duplication, truncation and splices. Every input must parse or
// throw ConfigError (tests/fuzz/config_fuzz_check.h); any other exception fails
// the test, a crash or a hang fails it too (ctest's TIMEOUT). The open-ended
// search is the libFuzzer target in tests/fuzz/.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_rng.h"
#include "fuzz/config_fuzz_check.h"

namespace fs = std::filesystem;

namespace {

using batchdist::fuzz::Rng;

std::string readAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Seed {
  std::string name;
  std::string text;
};

/// configs/*.yaml, tests/fuzz/corpus/*, and generated extremes.
std::vector<Seed> seeds() {
  std::vector<Seed> out;
  for (const char* dir : {"/configs", "/tests/fuzz/corpus"}) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(std::string(BATCHDIST_SOURCE_DIR) + dir)) {
      if (e.is_regular_file()) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());  // directory order is not deterministic
    for (const auto& f : files) out.push_back({f.filename().string(), readAll(f)});
  }
  const auto rep = [](const std::string& s, int n) {
    std::string r;
    for (int i = 0; i < n; ++i) r += s;
    return r;
  };
  out.push_back({"deep_seq_10000", "model:\n  hidden: " + rep("[", 10000) + "1" + rep("]", 10000)});
  out.push_back({"deep_map_5000", "batch: " + rep("{a: ", 5000) + "1" + rep("}", 5000)});
  out.push_back({"deep_block_5000", "model:\n  hidden:\n" + rep("- ", 5000) + "1\n"});
  out.push_back({"deep_indent_2000", [&] {
                   std::string s = "train:\n";
                   for (int i = 1; i < 2000; ++i) s += std::string(i, ' ') + "k:\n";
                   return s;
                 }()});
  out.push_back({"aliases_fanout", [&] {
                   // "billion laughs": yaml-cpp shares aliased nodes, nothing may expand them.
                   std::string s = "a0: &a0 [x, x, x, x, x, x, x, x]\n";
                   for (int i = 1; i < 12; ++i) {
                     s += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [" +
                          rep("*a" + std::to_string(i - 1) + ", ", 7) + "*a" +
                          std::to_string(i - 1) + "]\n";
                   }
                   return s + "model: {hidden: *a11}\ndata: {path: *a11}\n";
                 }()});
  out.push_back({"long_line_1MiB", "data:\n  name: csv\n  path: " + std::string(1 << 20, 'p') + "\n"});
  out.push_back({"many_keys", [&] {
                   std::string s = "batch:\n";
                   for (int i = 0; i < 20000; ++i) s += "  k" + std::to_string(i) + ": 1\n";
                   return s;
                 }()});
  return out;
}

const std::vector<std::string> kPunctuation = {
    ":", ": ", "- ", "[", "]", "{", "}", ",", "&a ", "*a", "<<: *a\n", "!!binary ", "!!str ",
    "!!int ", "!x ", "? ", "|", ">-", "#", "'", "\"", "---\n", "...\n", "\t", "\n", "  ",
    "%YAML 1.2\n", "~", "null", ".inf", "-.inf", ".nan", "0x", "0o", "1e999", "-", "auto",
    "9223372036854775807", "9223372036854775808", "-9223372036854775809", "4611686018427387904",
    "\\u0000", "\xEF\xBB\xBF", "\xFF", "\x80", "\xED\xA0\x80", "\xC0\xAF", std::string(1, '\0'),
    "batch:", "model:", "global:", "per_gpu:", "hidden:", "path:", "cache:"};

/// One mutation of `s` (deterministic given the generator's state).
void mutate(std::string& s, Rng& rng, const std::vector<Seed>& pool) {
  const auto lines = [&] {
    std::vector<std::string> v;
    std::string cur;
    for (char c : s) {
      cur += c;
      if (c == '\n') v.push_back(std::move(cur)), cur.clear();
    }
    if (!cur.empty()) v.push_back(cur);
    return v;
  };
  const auto join = [](const std::vector<std::string>& v) {
    std::string r;
    for (const auto& l : v) r += l;
    return r;
  };
  switch (rng.below(9)) {
    case 0:  // flip a bit
      if (!s.empty()) s[rng.below(s.size())] ^= static_cast<char>(1u << rng.below(8));
      break;
    case 1:  // insert YAML punctuation
      s.insert(rng.below(s.size() + 1), kPunctuation[rng.below(kPunctuation.size())]);
      break;
    case 2: {  // delete a short range
      if (s.empty()) break;
      const auto at = rng.below(s.size());
      s.erase(at, 1 + rng.below(16));
      break;
    }
    case 3: {  // swap two lines
      auto v = lines();
      if (v.size() < 2) break;
      std::swap(v[rng.below(v.size())], v[rng.below(v.size())]);
      s = join(v);
      break;
    }
    case 4: {  // duplicate a line
      auto v = lines();
      if (v.empty()) break;
      const auto i = rng.below(v.size());
      v.insert(v.begin() + static_cast<long>(rng.below(v.size() + 1)), v[i]);
      s = join(v);
      break;
    }
    case 5:  // truncate
      s.resize(rng.below(s.size() + 1));
      break;
    case 6: {  // replace a digit run with an extreme number
      static const char* kNumbers[] = {"0", "-1", "99999999999999999999", "4611686018427387904",
                                       "1e308", "-0.0", ".nan", "2147483648", "1_0"};
      const auto at = s.find_first_of("0123456789", rng.below(s.size() + 1));
      if (at == std::string::npos) break;
      const auto end = s.find_first_not_of("0123456789", at);
      s.replace(at, (end == std::string::npos ? s.size() : end) - at,
                kNumbers[rng.below(std::size(kNumbers))]);
      break;
    }
    case 7: {  // splice in a line of another seed
      const auto& other = pool[rng.below(pool.size())].text;
      if (other.empty()) break;
      const auto from = rng.below(other.size());
      const auto nl = other.find('\n', from);
      const auto piece = other.substr(from, std::min<std::size_t>(
                                                (nl == std::string::npos ? other.size() : nl + 1) - from,
                                                256));
      s.insert(rng.below(s.size() + 1), piece);
      break;
    }
    default: {  // change the indentation of a line (YAML's structure)
      auto v = lines();
      if (v.empty()) break;
      auto& l = v[rng.below(v.size())];
      if (rng.below(2) == 0) {
        l.insert(0, std::string(1 + rng.below(4), rng.below(4) == 0 ? '\t' : ' '));
      } else {
        l.erase(0, std::min(l.find_first_not_of(' '), l.size()));
      }
      s = join(v);
    }
  }
}

}  // namespace

TEST(ConfigFuzz, SeedsOnlyParseOrThrowConfigError) {
  for (const auto& seed : seeds()) {
    SCOPED_TRACE(seed.name);
    EXPECT_EQ(batchdist::fuzz::checkInput(seed.text), "");
  }
}

TEST(ConfigFuzz, MutationsOnlyParseOrThrowConfigError) {
  const auto pool = seeds();
  // Mutating the megabyte-sized seeds thousands of times would only measure
  // memcpy; they are checked whole above.
  std::vector<const Seed*> small;
  for (const auto& s : pool) {
    if (s.text.size() <= 64 * 1024) small.push_back(&s);
  }
  ASSERT_GE(small.size(), 20u);
  constexpr int kInputs = 5000;
  // A failing input is kept for a person to replay, under a name of this process's
  // own (mkstemps), so that two runs at once never write one file (Note [scratch dirs]).
  std::string reproducer;
  Rng rng(0x62646973);  // fixed: the same inputs on every run
  const auto t0 = std::chrono::steady_clock::now();
  int parsed = 0, failures = 0;
  double slowest = 0;
  int slowest_input = -1;
  for (int i = 0; i < kInputs && failures < 5; ++i) {
    const Seed& seed = *small[static_cast<std::size_t>(i) % small.size()];
    std::string text = seed.text;
    const int rounds = 1 + static_cast<int>(rng.below(4));
    for (int k = 0; k < rounds; ++k) mutate(text, rng, pool);
    bool ok = false;
    const auto t = std::chrono::steady_clock::now();
    const auto problem = batchdist::fuzz::checkInput(text, &ok);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    if (took > slowest) slowest = took, slowest_input = i;
    parsed += ok;
    if (!problem.empty()) {
      ++failures;
      if (reproducer.empty()) {
        reproducer = (fs::path(::testing::TempDir()) / "config_fuzz_failing_input_XXXXXX.yaml").string();
        const int fd = ::mkstemps(reproducer.data(), 5);
        if (fd >= 0) ::close(fd);
      }
      std::ofstream(reproducer, std::ios::binary) << text;
      ADD_FAILURE() << "input " << i << " (from seed " << seed.name << ", saved to " << reproducer
                    << "): " << problem;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Bounded time: no input may make the loader crawl (e.g. quadratic in nesting);
  // a typical input takes a millisecond or two, so 5 s is slow even on a loaded
  // machine. The total is a backstop well under ctest's TIMEOUT.
  EXPECT_LT(slowest, 5.0) << "input " << slowest_input;
  EXPECT_LT(seconds, 120.0);
  // The mutations must not all be rejected at the first byte: some still parse.
  EXPECT_GT(parsed, kInputs / 50) << "only " << parsed << " of " << kInputs << " inputs parsed";
  std::cout << "[ config fuzz ] " << kInputs << " mutated inputs, each with "
            << batchdist::fuzz::overrideSets("").size() << "+ --set lists, in " << seconds
            << " s (slowest " << slowest << " s); " << parsed
            << " parsed as they are, the rest threw ConfigError\n";
}
