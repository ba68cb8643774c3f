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
    if (const auto c = kv.find("collectives"); c != kv.end()) b.collectives = std::stoll(c->second);
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
  v.kind = Verdict::Kind::kStall;
  v.why = strCat("no step finished for ", worker::formatFixed(now - progress_at_, 1),
                 " s (elastic.stall_s ", limits_.stall_s, "): every rank beats, the last step done is ",
                 best_step_, "; ", behind(&v.ranks));
  return v;
}

// Every rank beats but none finishes a step: the ones the rest wait for are
// behind in steps or, since a step needs every rank and so all have done the
// same, in the collectives started (Note [heartbeat]): the others wait inside one
// the hung rank has not reached. If none is behind, all are named.
std::string Monitor::behind(std::vector<int>* ranks) const {
  const auto lowest = [&](auto field) {
    int64_t low = field(ranks_.front().last), high = low;
    for (const auto& r : ranks_) {
      low = std::min(low, field(r.last));
      high = std::max(high, field(r.last));
    }
    return std::pair{low, high};
  };
  const auto [low_step, high_step] = lowest([](const Beat& b) { return b.step; });
  const auto [low_ops, high_ops] = lowest([](const Beat& b) { return b.collectives; });
  const bool by_step = low_step < high_step;
  const bool by_ops = !by_step && low_ops >= 0 && low_ops < high_ops;
  for (int i = 0; i < world(); ++i) {
    const Beat& b = ranks_[static_cast<size_t>(i)].last;
    if (by_step ? b.step == low_step : !by_ops || b.collectives == low_ops) ranks->push_back(i);
  }
  const std::string who = strCat(ranks->size(), " rank(s)");
  if (by_step) return strCat("behind at step ", low_step, ": ", who);
  if (by_ops) {
    return strCat("behind in collectives started (", low_ops, ", the others up to ", high_ops,
                  "): ", who, " the others wait for");
  }
  return "every rank";
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
