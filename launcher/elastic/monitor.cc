#include "launcher/elastic/monitor.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "common/error.h"
#include "worker/common/console.h"

namespace batchdist::launcher::elastic {

std::optional<Beat> parseBeat(const std::string& text) {
  std::istringstream in(text);
  std::string magic, version;
  if (!(in >> magic >> version) || magic != "batchdist-heartbeat" || version != "1") return std::nullopt;
  std::map<std::string, std::string> kv;
  for (std::string w; in >> w;) {
    const auto eq = w.find('=');
    if (eq == std::string::npos) return std::nullopt;
    kv[w.substr(0, eq)] = w.substr(eq + 1);
  }
  Beat b;
  try {
    b.attempt = std::stoi(kv.at("attempt"));
    b.rank = std::stoi(kv.at("rank"));
    b.pid = std::stoi(kv.at("pid"));
    b.phase = kv.at("phase");
    b.step = std::stoll(kv.at("step"));
    b.checkpoint = std::stoll(kv.at("checkpoint"));
    b.per_gpu = std::stoll(kv.at("per_gpu"));
    b.accum = std::stoll(kv.at("accum"));
    b.global = std::stoll(kv.at("global"));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return b;
}

Monitor::Monitor(int attempt, int world, MonitorLimits limits, double now)
    : attempt_(attempt), limits_(limits), started_(now), ranks_(static_cast<size_t>(world)) {}

void Monitor::record(const Beat& b, double now) {
  if (b.attempt != attempt_ || b.rank < 0 || b.rank >= world()) return;
  auto& r = ranks_[static_cast<size_t>(b.rank)];
  r.heard = true;
  r.last_heard = now;
  r.last = b;
  if (b.phase != "train" && b.phase != "finish" && b.phase != "done") return;
  if (start_step_ < 0) {
    start_step_ = b.step;
    best_step_ = b.step;
    progress_at_ = now;
  }
  if (b.step > best_step_) {
    best_step_ = b.step;
    progress_at_ = now;
    if (first_step_at_ < 0) first_step_at_ = now;
  }
}

Verdict Monitor::check(double now) const {
  Verdict v;
  std::string why;
  for (int i = 0; i < world(); ++i) {
    const auto& r = ranks_[static_cast<size_t>(i)];
    if (r.heard && r.last.phase == "done") continue;  // finished: its silence is its exit
    const double silent = now - (r.heard ? r.last_heard : started_);
    const double limit = r.heard ? limits_.heartbeat_timeout_s : limits_.start_timeout_s;
    if (silent <= limit) continue;
    v.ranks.push_back(i);
    const std::string secs = worker::formatFixed(silent, 1);
    why += strCat(why.empty() ? "" : "; ", "rank ", i,
                  r.heard ? strCat(" silent for ", secs, " s (last heard in ", r.last.phase,
                                   " at step ", r.last.step, ")")
                          : strCat(" never heard from in ", secs, " s after the launch"));
  }
  if (!v.ranks.empty()) {
    v.kind = Verdict::Kind::kSilent;
    v.why = why;
    return v;
  }
  // A hang is training without steps: not evaluation's end, not the report's writing.
  if (!training() || progress_at_ < 0 || now - progress_at_ <= limits_.stall_s) return v;
  // Every rank beats but none finishes a step: the ranks behind the others are
  // the ones the rest wait for; if none is behind, all are named.
  int64_t low = best_step_;
  for (const auto& r : ranks_) low = std::min(low, r.last.step);
  for (int i = 0; i < world(); ++i) {
    if (ranks_[static_cast<size_t>(i)].last.step == low) v.ranks.push_back(i);
  }
  const std::string secs = worker::formatFixed(now - progress_at_, 1);
  v.kind = Verdict::Kind::kStall;
  v.why = strCat("no step finished for ", secs, " s (elastic.stall_s ", limits_.stall_s,
                 "): every rank beats, the last step done is ", best_step_,
                 low < best_step_ ? strCat("; behind at step ", low, ": ") : "; ",
                 v.ranks.size() == ranks_.size() ? "every rank"
                                                 : strCat(v.ranks.size(), " rank(s)"));
  return v;
}

int64_t Monitor::lastStep() const {
  int64_t s = best_step_;
  for (const auto& r : ranks_) {
    if (r.heard && r.last.phase != "setup" && r.last.phase != "search") s = std::max(s, r.last.step);
  }
  return s;
}

int64_t Monitor::checkpoint() const {
  const auto& r0 = ranks_.front();  // rank 0 writes them (Note [background checkpoint])
  return r0.heard ? r0.last.checkpoint : -1;
}

bool Monitor::training() const {
  for (const auto& r : ranks_) {
    if (!r.heard || r.last.phase != "train") return false;
  }
  return true;
}

Beat Monitor::batch() const {
  for (const auto& r : ranks_) {
    if (r.heard && r.last.global > 0) return r.last;
  }
  return {};
}

}  // namespace batchdist::launcher::elastic
