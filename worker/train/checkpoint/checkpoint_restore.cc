// Reading a checkpoint back: verify it against its manifest, find the newest
// valid one, restore a run's state from it, and refuse one this run may not continue.
#include "worker/train/checkpoint/checkpoint.h"

#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "common/error.h"
#include "worker/common/files.h"
#include "worker/common/util.h"
#include "worker/model/archive.h"
#include "worker/model/model.h"
#include "worker/model/optimizer.h"
#include "worker/model/precision.h"
#include "worker/train/checkpoint/rng_records.h"
#include "worker/train/checkpoint/sharded_checkpoint.h"
#include "worker/train/shard/sharded_optimizer.h"

namespace batchdist::worker {
namespace fs = std::filesystem;

namespace {

/// manifest.json of `path`, parsed and checked against its own checksum, or why not.
std::string readCheckedManifest(const std::string& path, nlohmann::ordered_json* json,
                                std::string* text) {
  const auto manifest_path = (fs::path(path) / "manifest.json").string();
  std::error_code ec;
  if (!fs::exists(manifest_path, ec)) return "no manifest.json (an incomplete write?)";
  try {  // Note [input files are regular files]: a FIFO here waited in open()
    *text = readFileBounded(manifest_path, 64 << 20, "manifest");
  } catch (const Error& e) {
    return e.what();
  }
  try {
    *json = nlohmann::ordered_json::parse(*text);
  } catch (const std::exception& e) {
    return strCat("manifest.json is not valid JSON (", e.what(), ")");
  }
  if (!json->is_object() || !json->contains("checksum") ||
      (*json)["checksum"] != manifestChecksum(*json)) {
    return "manifest.json fails its checksum (damaged)";
  }
  return "";
}

/// Why a file the manifest lists must not be loaded, or "".
std::string checkFile(const std::string& path, const ManifestFile& f) {
  const auto file = (fs::path(path) / f.name).string();
  const InputFile in = openInputFile(file);  // Note [input files are regular files]
  if (in.fd < 0) {
    return strCat(f.name, ": ", in.error == ENOENT ? std::string("missing") : in.why());
  }
  if (in.size != f.bytes) {
    return strCat(f.name, ": ", in.size, " bytes, the manifest says ", f.bytes, " (truncated?)");
  }
  if (fnv1a64Hex(readFileBounded(file, kMaxCheckpointFile, "checkpoint file")) != f.fnv1a64) {
    return strCat(f.name, ": checksum mismatch (the file was damaged after it was written)");
  }
  return "";
}

}  // namespace

CheckpointCheck verifyCheckpoint(const std::string& path) {
  CheckpointCheck c;
  c.path = path;
  nlohmann::ordered_json json;
  c.problem = readCheckedManifest(path, &json, &c.text);
  if (!c.problem.empty()) return c;
  try {  // Note [manifest formats]: the one reader
    c.manifest = readManifest(json);
  } catch (const Error& e) {
    c.problem = e.what();
    return c;
  }
  for (const auto& f : c.manifest.files) {
    c.problem = checkFile(path, f);
    if (!c.problem.empty()) return c;
  }
  return c;
}

std::optional<CheckpointCheck> findLatestCheckpoint(const std::string& dir,
                                                    std::vector<std::string>* rejected) {
  for (const auto& [step, path] : listCheckpoints(dir)) {
    auto c = verifyCheckpoint(path);
    if (c.problem.empty()) return c;
    if (rejected) rejected->push_back(strCat(path, ": ", c.problem));
  }
  return std::nullopt;
}

namespace {

/// Copies the saved tensors into the model's own, in place (shapes checked).
void restoreModel(const std::string& dir, const CheckpointManifest& m, Model& model,
                  const at::Device& device) {
  torch::serialize::InputArchive archive;
  loadArchiveBytes(archive,
                   readFileBounded((fs::path(dir) / "model.pt").string(), kMaxCheckpointFile,
                                   "checkpoint file"),
                   device);
  torch::NoGradGuard no_grad;
  const auto restore = [&](const char* prefix, const auto& named,
                           const std::vector<std::string>& saved, const char* what) {
    if (saved.size() != named.size()) {
      throw Error(strCat(dir, ": the checkpoint has ", saved.size(), " ", what,
                         ", this model ", named.size()));
    }
    for (std::size_t i = 0; i < named.size(); ++i) {
      torch::Tensor t;
      archive.read(strCat(prefix, i), t, /*is_buffer=*/true);
      if (!t.sizes().equals(named[i].second.sizes())) {
        throw Error(strCat(dir, ": ", named[i].first, " has shape ", shapeText(t.sizes().vec()),
                           " in the checkpoint, ", shapeText(named[i].second.sizes().vec()),
                           " in this model"));
      }
      named[i].second.copy_(t);
    }
  };
  restore("p", model.namedParameters(), m.parameters, "parameters");
  restore("b", model.namedBuffers(), m.buffers, "buffers");
}

/// The optimizer's state from optimizer.pt (an unsharded run's) or
/// optimizer_state.bin (a sharded run's), into a sharded or a whole optimizer
/// (Note [sharded checkpoint]).
void restoreOptimizer(const CheckpointCheck& ckpt, const TrainState& state) {
  auto* sharded = dynamic_cast<ShardedOptimizer*>(state.optimizer);
  const auto& m = ckpt.manifest;
  if (m.optimizer_state) {
    restoreFlatState((fs::path(ckpt.path) / kStateFile).string(), *m.optimizer_state,
                     *state.optimizer, sharded, state.model->trainableParameters());
    return;
  }
  const auto bytes = readFileBounded((fs::path(ckpt.path) / "optimizer.pt").string(),
                                     kMaxCheckpointFile, "checkpoint file");
  if (sharded) {
    restoreWholeIntoSharded(bytes, *sharded, state.device);
  } else {
    state.optimizer->loadState(bytes, state.device);
  }
}

}  // namespace

void restoreState(const CheckpointCheck& ckpt, const TrainState& state, int rank, int world) {
  const auto& m = ckpt.manifest;
  {
    // Note [parameter units]: restored whole on every rank, then kept as each rank's shard.
    const WholeParameters whole(*state.model, /*absorb_writes=*/true);
    restoreModel(ckpt.path, m, *state.model, state.device);
  }
  restoreOptimizer(ckpt, state);
  if (state.scaler && m.loss_scaler) {
    state.scaler->restore(m.loss_scaler->scale, m.loss_scaler->tracker, m.loss_scaler->skipped);
  }
  // Note [checkpoint]: rank r's generators belong to rank r of the same world size.
  if (m.plan.world_size != world) return;
  restoreRng(ckpt.path, m.rng, rank, state.device);
}

void checkResumable(const CheckpointManifest& m, const Config& cfg, const std::string& path) {
  const auto& then = m.config;
  // Loader threads and staging change how batches are made, not which.
  // model.recompute changes neither the weights nor the arithmetic (Note [activation recompute]);
  // optim.kernels keeps the state's meaning (Note [multi-tensor step]), and a
  // checkpoint from before the key has none; model.flops_per_sample only measures.
  const std::vector<std::string> free_keys = {"data.workers", "data.prefetch", "data.pin_memory",
                                              "model.recompute", "optim.kernels",
                                              "model.flops_per_sample"};
  std::string diff;
  for (const char* section : {"model", "data", "optim"}) {
    for (const auto& [key, value] : cfg.resolved[section].items()) {
      const std::string full = strCat(section, ".", key);
      if (std::find(free_keys.begin(), free_keys.end(), full) != free_keys.end()) continue;
      const auto old = then.value(section, nlohmann::ordered_json::object()).value(key, nlohmann::ordered_json());
      if (old != value) diff += strCat(diff.empty() ? "" : "; ", full, " = ", value.dump(), " now, ", old.dump(), " in the checkpoint");
    }
  }
  for (const char* key : {"seed"}) {
    const auto now = cfg.resolved["train"][key], old = then["train"].value(key, nlohmann::ordered_json());
    if (now != old) diff += strCat(diff.empty() ? "" : "; ", "train.", key, " = ", now.dump(), " now, ", old.dump(), " in the checkpoint");
  }
  if (cfg.resolved["batch"]["last_batch"] != then["batch"].value("last_batch", nlohmann::ordered_json())) {
    diff += strCat(diff.empty() ? "" : "; ", "batch.last_batch differs from the checkpoint's");
  }
  const bool adaptive = !m.adapt.is_null();
  if (adaptive && cfg.batch.adapt == BatchAdapt::kOff) {
    diff += strCat(diff.empty() ? "" : "; ", "batch.adapt = off now, ",
                   then["batch"].value("adapt", std::string("goodput")),
                   " in the checkpoint (its global batch and progress are adaptive)");
  } else if (adaptive) {
    // goodput <-> warmup may change (as adapt_every_steps may): both keep the same
    // record, progress and gain rule, only the next decisions differ.
    // A checkpoint from before the key was written under AdaScale.
    const auto old_gain = then["batch"].value("adapt_gain", std::string("adascale"));
    if (toString(cfg.batch.adapt_gain) != old_gain) {
      diff += strCat(diff.empty() ? "" : "; ", "batch.adapt_gain = ", toString(cfg.batch.adapt_gain),
                     " now, ", old_gain,
                     " in the checkpoint (its progress counts G0-equivalent steps by that rule)");
    }
  }
  const int64_t g = m.plan.global;
  if (cfg.batch.global > 0 && cfg.batch.global != g) {
    diff += strCat(diff.empty() ? "" : "; ", "batch.global = ", cfg.batch.global,
                   cfg.batch.global_tokens > 0  // Note [global tokens]
                       ? strCat(" (batch.global_tokens ", cfg.batch.global_tokens, ")")
                       : std::string(),
                   " now, ", g, " in the checkpoint");
  }
  if (!diff.empty()) {
    throw ConfigError(strCat(cfg.source, ": cannot resume ", path, ": ", diff,
                          ". A resumed run must train the same model with the same optimizer on "
                          "the same data with the same global batch (world size, per-GPU batch "
                          "and accumulation may change); start fresh in another --output or "
                          "checkpoint.dir, or restore those keys"));
  }
}

}  // namespace batchdist::worker
