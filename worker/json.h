#pragma once
// Minimal JSON writing for reports (reading goes through yaml-cpp, a JSON superset).

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace batchdist::worker::json {

inline std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

inline std::string number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}
inline std::string number(int64_t v) { return std::to_string(v); }
inline std::string number(int v) { return std::to_string(v); }

/// An object whose members keep insertion order.
class Object {
 public:
  Object& raw(const std::string& key, const std::string& json_value) {
    body_ += (body_.empty() ? "" : ", ") + quote(key) + ": " + json_value;
    return *this;
  }
  Object& add(const std::string& key, const std::string& v) { return raw(key, quote(v)); }
  Object& add(const std::string& key, const char* v) { return raw(key, quote(v)); }
  Object& add(const std::string& key, double v) { return raw(key, number(v)); }
  Object& add(const std::string& key, int64_t v) { return raw(key, number(v)); }
  Object& add(const std::string& key, int v) { return raw(key, number(v)); }
  Object& add(const std::string& key, bool v) { return raw(key, v ? "true" : "false"); }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

/// A JSON array of already-encoded values.
inline std::string array(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out + "]";
}

}  // namespace batchdist::worker::json
