#include "worker/data/labels.h"

#include <algorithm>
#include <limits>

#include "common/error.h"

namespace batchdist::worker {
namespace {

/// Classes listed by name in a message before "... (N in all)".
constexpr std::size_t kClassesNamed = 8;

int64_t givenCount(const std::vector<int64_t>& labels, int64_t given,
                   const std::function<std::string(int64_t)>& where) {
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0 || labels[i] >= given) {
      throw ConfigError(strCat("label ", labels[i], " in ", where(static_cast<int64_t>(i)),
                               " is outside 0..", given - 1, " (data.classes: ", given,
                               "); fix the label, or raise data.classes"));
    }
  }
  return given;
}

}  // namespace

std::string classListText(const std::vector<int64_t>& classes) {
  std::string out;
  const std::size_t shown = std::min(classes.size(), kClassesNamed);
  for (std::size_t i = 0; i < shown; ++i) {
    if (i > 0) out += (i + 1 == classes.size()) ? " and " : ", ";
    out += std::to_string(classes[i]);
  }
  if (shown < classes.size()) out += strCat(", ... (", classes.size(), " in all)");
  return out;
}

int64_t classCount(const std::vector<int64_t>& labels, int64_t given,
                   const std::function<std::string(int64_t)>& where, std::vector<int64_t>* empty) {
  if (given > 0) return givenCount(labels, given, where);
  int64_t max_label = -1;
  std::size_t max_at = 0;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0) {
      throw ConfigError(strCat("label ", labels[i], " in ", where(static_cast<int64_t>(i)),
                               " is negative; labels are class indices 0, 1, ..."));
    }
    if (labels[i] > max_label) max_label = labels[i], max_at = i;
  }
  if (max_label < 0) return 2;
  std::vector<int64_t> sorted(labels);
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  const auto distinct = static_cast<int64_t>(sorted.size());
  const int64_t count = max_label + 1;
  if (2 * distinct < count) {
    throw ConfigError(strCat("label ", max_label, " in ", where(static_cast<int64_t>(max_at)), ": ",
                             distinct, " distinct labels would make a ", count,
                             "-way head (fewer than half of the classes 0..", max_label,
                             " have a sample); fix the label, or set data.classes if that is "
                             "intended"));
  }
  if (empty != nullptr) {
    empty->clear();
    for (int64_t c = 0, k = 0; c < count; ++c) {
      if (k < distinct && sorted[k] == c) {
        ++k;
      } else {
        empty->push_back(c);
      }
    }
  }
  return std::max<int64_t>(count, 2);
}

}  // namespace batchdist::worker
