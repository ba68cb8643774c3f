#include "worker/search/cache.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <filesystem>
#include <set>

#include "common/error.h"
#include "collective/torch_compat.h"
#include "worker/common/console.h"
#include "worker/common/files.h"
#include "worker/model/program_model.h"
#include "worker/search/levers.h"
#include "worker/search/output.h"

namespace batchdist::worker {
namespace {

/// A cache file is small; anything larger is not ours.
constexpr std::uintmax_t kMaxCacheBytes = std::uintmax_t{16} << 20;

/// Why `r` cannot be trusted as a search result, or "".
std::string implausible(const SearchResult& r) {
  if (r.chosen <= 0) return strCat("chosen per-GPU batch ", r.chosen, " is not positive");
  if (r.chosen_accum <= 0) return strCat("chosen accumulation ", r.chosen_accum, " is not positive");
  for (const auto& c : r.candidates) {
    if (isChosen(r, c) && !c.failed) return "";
  }
  return strCat("chosen per-GPU batch ", r.chosen, " x accum ", r.chosen_accum,
                " is not among the measured candidates that fit");
}

/// The candidates at or above the smallest batch that ran out of memory in
/// training count as failed; the choice is made again. Returns the note, or
/// throws Error when nothing is left.
std::string applyTrainingOoms(const nlohmann::json& marks, SearchResult& r) {
  const nlohmann::json* worst = nullptr;  // the smallest per-GPU batch that failed
  for (const auto& m : marks) {
    if (!worst || m.at("per_gpu").get<int64_t>() < worst->at("per_gpu").get<int64_t>()) worst = &m;
  }
  if (!worst) return "";
  const int64_t limit = worst->at("per_gpu");
  const std::string reason =
      strCat("out of memory in training at step ", worst->at("step").get<int64_t>(), " on rank ",
             worst->at("rank").get<int64_t>(), " (peak ", formatFixed(worst->at("peak_mb").get<double>(), 0),
             " MB)");
  // The adapt range too (Note [adapt range]): the adaptive batch does not take
  // a size that ran out of memory in training either. Training ran under the
  // chosen levers (Note [lever search]): a size under them, or under levers that
  // save less memory, fails too; under levers that save more it may still fit.
  const auto savesNoMore = [&](const Levers& l) {
    return shardSaving(l.shard) <= shardSaving(r.chosen_levers.shard) &&
           (l.recompute == Recompute::kOff || l.recompute == r.chosen_levers.recompute);
  };
  for (auto* list : {&r.candidates, &r.adapt_range}) {
    for (auto& c : *list) {
      if (c.per_gpu >= limit && !c.failed && savesNoMore(c.levers)) {
        c.failed = true;
        c.reason = reason;
      }
    }
  }
  const int64_t before = r.chosen;
  const auto& c =
      chooseCandidate(r.candidates, r.objective, r.tolerance, &r.why, r.tokens_per_sample);
  r.chosen = c.per_gpu;
  r.chosen_accum = c.accum;
  r.chosen_levers = c.levers;
  return strCat("per-GPU batch ", limit, " ran ", reason, "; taking ", r.chosen,
                r.chosen != before ? strCat(" instead of ", before) : std::string(),
                " from the cached measurements");
}

}  // namespace

std::string searchCacheKey(const Config& cfg, const SearchCacheInputs& in) {
  // The resolved model/optim/search/batch sections plus what the machine adds.
  nlohmann::ordered_json key;
  for (const char* section : {"model", "optim", "search", "batch"}) {
    auto s = cfg.resolved.value(section, nlohmann::ordered_json::object());
    s.erase("cache");
    s.erase("per_gpu");
    // Note [search traces]: a traced search is measured again (its traces are
    // its point); an untraced one keys as before the key existed.
    if (!cfg.search.profile) s.erase("profile");
    key[section] = s;
  }
  key["task"] = in.task;
  key["data"] = {{"shape", in.sample_shape}, {"outputs", in.outputs}, {"train", in.train_size},
                 {"resize", cfg.data.resize}};
  std::vector<std::string> budgets;
  for (double b : in.budgets) budgets.push_back(formatFixed(b, 0));
  key["precision"] = toString(cfg.train.precision);
  key["device"] = in.device;
  key["world"] = in.world;
  key["budgets"] = budgets;
  key["torch"] = compat::torchVersion();
  // dist.shard changes what fits (Note [sharded optimizer]); unsharded keys as before.
  if (cfg.dist.shard != Shard::kNone) key["shard"] = toString(cfg.dist.shard);
  // Note [program parts]: a program's module is known by its type and shapes.
  if (cfg.model.program) key["module"] = cfg.model.program->signature();
  // The walk's rules: 2 caps the per-GPU batch under batch.global: auto at
  // batch.adapt_min_steps steps an epoch (a cache from before may hold a larger pick).
  key["rules"] = 2;
  return key.dump();
}

CacheLookup readSearchCache(const std::string& path, const std::string& key) {
  CacheLookup out;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return out;  // first run: search
  try {
    const auto root = nlohmann::json::parse(readFileBounded(path, kMaxCacheBytes, "search cache"));
    if (!root.is_object() || !root.contains("key") || !root.contains("result")) {
      out.problem = strCat(path, ": not a batchdist search cache (no key/result)");
      return out;
    }
    if (!root["key"].is_string() || root["key"].get<std::string>() != key) return out;  // other setup
    auto r = searchFromJson(root.at("result"));
    if (const auto why = implausible(r); !why.empty()) {
      out.problem = strCat(path, ": damaged entry: ", why);
      return out;
    }
    if (root.contains("oom_in_training")) {
      try {
        out.note = applyTrainingOoms(root["oom_in_training"], r);
      } catch (const Error& e) {
        out.note = strCat("every cached candidate that fits ran out of memory in training (",
                          e.what(), "); searching again");
        return out;
      }
    }
    r.cached = true;
    r.timed_steps = 0;  // none this run
    r.seconds = 0;
    out.result = std::move(r);
  } catch (const Error& e) {
    out.problem = e.what();
  } catch (const std::exception& e) {
    out.problem = strCat(path, ": damaged: ", e.what());
  }
  return out;
}

void markSearchCacheOom(const std::string& path, const std::string& key,
                        const std::vector<TrainingOom>& ooms) {
  std::error_code ec;
  if (ooms.empty() || !std::filesystem::exists(path, ec)) return;
  nlohmann::ordered_json root;
  try {
    root = nlohmann::ordered_json::parse(readFileBounded(path, kMaxCacheBytes, "search cache"));
  } catch (const std::exception&) {
    return;  // damaged: the next run ignores it and searches anyway
  }
  if (!root.is_object() || !root.contains("key") || root["key"] != key) return;
  auto& marks = root["oom_in_training"];
  if (!marks.is_array()) marks = nlohmann::ordered_json::array();
  for (const auto& o : ooms) {
    marks.push_back({{"per_gpu", o.per_gpu}, {"accum", o.accum}, {"step", o.step},
                     {"rank", o.rank}, {"peak_mb", o.peak_mb}});
  }
  writeFileAtomic(path, root.dump(2) + "\n");
}

void writeSearchCache(const std::string& path, const std::string& key, const SearchResult& r) {
  nlohmann::ordered_json j{{"key", key}, {"result", searchJson(r)}};
  writeFileAtomic(path, j.dump(2) + "\n");
}

}  // namespace batchdist::worker
