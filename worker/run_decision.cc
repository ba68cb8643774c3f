#include "worker/run_decision.h"

#include <filesystem>
#include <iostream>
#include <vector>

#include "common/error.h"
#include "worker/common/files.h"
#include "worker/common/util.h"

namespace batchdist::worker {
namespace fs = std::filesystem;

Config decidedConfig(const Config& cfg, const std::optional<BatchConfig>& batch,
                     const std::optional<Levers>& levers) {
  Config out = levers ? withLevers(cfg, *levers) : cfg;
  if (batch) {
    out.batch = *batch;
    out.resolved["batch"]["global"] = batch->global;
    out.resolved["batch"]["accum"] = nullptr;
  }
  return out;
}

bool resumeRequested(const RunRequest& req, const Config& cfg) {
  if (req.search_only) return false;
  return !req.resume.empty() || cfg.checkpoint.resume == ResumeMode::kAuto;
}

namespace {

/// Rank 0's choice of checkpoint for --resume / checkpoint.resume (auto: the
/// newest valid one in the checkpoint dir; PATH: that checkpoint, or the newest
/// valid one in that directory). Prints what it skipped and why.
std::optional<CheckpointCheck> findResumeCheckpoint(const RunRequest& req, const RunSetup& s,
                                                    std::string* problem) {
  const std::string want = req.resume.empty() ? "auto" : req.resume;
  std::vector<std::string> rejected;
  std::optional<CheckpointCheck> found;
  std::error_code ec;
  if (want == "auto") {
    found = findLatestCheckpoint(s.checkpoint_dir, &rejected);
  } else if (fs::exists(fs::path(want) / "manifest.json", ec)) {
    auto c = verifyCheckpoint(want);
    if (c.problem.empty()) found = c;
    else *problem = strCat(want, " cannot be loaded: ", c.problem);
  } else if (fs::is_directory(want, ec)) {
    found = findLatestCheckpoint(want, &rejected);
    if (!found) *problem = strCat("no valid checkpoint in ", want);
  } else if (fs::exists(want, ec)) {  // Note [input files are regular files]: a FIFO too
    const InputFile f = openInputFile(want);
    *problem = strCat(want, ": is ", f.kind.empty() ? std::string("a file") : f.kind,
                      ", not a checkpoint (a step-* directory holding manifest.json, or a "
                      "directory of them)");
  } else {
    *problem = strCat(want, ": no such checkpoint (a step-* directory holding manifest.json, or a "
                            "directory of them)");
  }
  for (const auto& r : rejected) {
    std::cerr << strCat("batchdist: warning: resume: not loading checkpoint ", r,
                        found ? strCat("; taking the older ", found->path) : std::string(), "\n")
              << std::flush;
  }
  return found;
}

/// The checkpoint this run continues, or none (a fresh start): rank 0 decides and
/// says which in one line; every rank gets the manifest. Collective. Throws
/// ConfigError for a --resume PATH that cannot be loaded.
std::optional<CheckpointCheck> pickCheckpoint(const RunRequest& req, const RunSetup& s,
                                              collective::Communicator& comm, Console& console) {
  if (!resumeRequested(req, s.cfg)) return std::nullopt;
  std::string problem, path, manifest;
  if (comm.rank() == 0) {
    const auto found = findResumeCheckpoint(req, s, &problem);
    if (found) {
      path = found->path;
      manifest = found->text;
      const auto& p = found->manifest.plan;
      console.line(strCat("resume: continuing from ", path, " (step ", found->manifest.step,
                          " of ", p.total_steps, ", written by ", p.world_size,
                          " rank(s); now ", comm.size(), ")"));
    } else if (problem.empty()) {
      console.line(strCat("resume: no valid checkpoint in ", s.checkpoint_dir, "; starting fresh"));
    }
  }
  problem = comm.broadcast(problem, 0);
  if (!problem.empty()) throw ConfigError(strCat("--resume: ", problem));
  manifest = comm.broadcast(manifest, 0);
  if (manifest.empty()) return std::nullopt;
  CheckpointCheck c;
  c.path = comm.broadcast(path, 0);
  c.text = std::move(manifest);
  c.manifest = readManifest(nlohmann::ordered_json::parse(c.text));  // as rank 0 read it
  return c;
}

/// World sizes over which global batch `g` splits into micro-batches of at least `min_m`.
std::string worldSizesFor(int64_t g, int64_t min_m) {
  std::string out;
  for (int64_t w = 1; w <= std::min<int64_t>(g, 4096); ++w) {
    if (g % w == 0 && g / w >= min_m) out += strCat(out.empty() ? "" : ", ", w);
  }
  return out;
}

/// Note [lever search]: auto levers as the checkpoint's run chose them (none and
/// off for a checkpoint from before the levers were recorded); concrete ones as asked.
std::optional<Levers> resumedLevers(const Config& cfg, const CheckpointManifest& m,
                                    Console& console) {
  const Levers asked = configLevers(cfg);
  if (!hasAutoLevers(asked)) return std::nullopt;
  Levers then = m.levers;
  if (asked.shard != Shard::kAuto) then.shard = asked.shard;
  if (asked.recompute != Recompute::kAuto) then.recompute = asked.recompute;
  // A config that no longer takes parameters (Note [parameter units]) resumes
  // under gradients: the state resumes under any sharding (Note [sharded checkpoint]).
  if (then.shard == Shard::kParameters && !parametersUnsupported(cfg).key.empty()) {
    then.shard = Shard::kGradients;
  }
  console.line(strCat("levers: ", leversText(then), " (as the checkpoint's run chose for ",
                      autoLeversText(asked), ")"));
  return then;
}

}  // namespace

BatchConfig resumedBatch(const BatchConfig& asked, const ManifestPlan& then, int world,
                         bool has_bn, const std::string& path) {
  const int64_t g = then.global;
  const int64_t min_m = has_bn ? asked.min_per_gpu : 1;
  if (g % world != 0 || g / world < min_m) {
    throw ConfigError(strCat("cannot resume ", path, " on ", world, " rank(s): its global "
                             "batch ", g, " (kept on resume) does not split into equal "
                             "micro-batches", min_m > 1 ? strCat(" of at least ", min_m) : "",
                             " over ", world, " ranks; world sizes that work: ",
                             worldSizesFor(g, min_m)));
  }
  BatchConfig b = asked;
  b.global = g;
  b.global_auto = false;
  b.accum = 0;
  if (world == then.world_size || !b.per_gpu_auto) {
    int64_t m = world == then.world_size ? then.per_gpu : std::min(then.per_gpu, g / world);
    while ((g / world) % m != 0) --m;
    b.per_gpu = m;
    b.per_gpu_auto = false;
  }
  return b;
}

std::optional<ResumeDecision> decideResume(const RunRequest& req, const RunSetup& s,
                                           collective::Communicator& comm, Console& console) {
  auto picked = pickCheckpoint(req, s, comm, console);
  if (!picked) return std::nullopt;
  checkResumable(picked->manifest, s.cfg, picked->path);
  ResumeDecision d;
  d.batch = resumedBatch(s.cfg.batch, picked->manifest.plan, comm.size(), s.has_bn, picked->path);
  // A per-GPU batch searched again for a new world size searches the levers too.
  if (!d.batch.per_gpu_auto) d.levers = resumedLevers(s.cfg, picked->manifest, console);
  d.checkpoint = std::move(*picked);
  return d;
}

}  // namespace batchdist::worker
