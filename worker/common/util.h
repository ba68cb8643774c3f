#pragma once
// Small helpers several worker files share.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace batchdist::worker {

/// Seconds on a monotonic clock (for durations only).
inline double monotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// part / whole, 0 when there is no whole (a phase's share of a step's time).
inline double shareOf(double part, double whole) { return whole > 0 ? part / whole : 0.0; }

/// "[3, 32, 32]".
inline std::string shapeText(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

/// `s` with &, <, >, " and ' escaped for XML text and attributes.
inline std::string xmlEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

/// `path` relative to `base_dir` (the config file's directory) unless absolute.
inline std::string resolvePath(const std::string& path, const std::string& base_dir) {
  if (path.empty() || path[0] == '/' || base_dir.empty()) return path;
  return base_dir + "/" + path;
}

}  // namespace batchdist::worker
