#pragma once
// A checkpoint's manifest.json as a type (Note [checkpoint]): one writer, one
// reader, and the reader alone knows the older formats and converts them.

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "worker/config/config.h"
#include "worker/train/result.h"

namespace batchdist::worker {

struct Plan;

/// The format this batchdist writes, and the oldest it reads (Note [manifest formats]).
constexpr int kManifestFormat = 5;
constexpr int kOldestManifestFormat = 1;

/// FNV-1a 64 of `n` bytes, continuing from `hash`.
uint64_t fnv1a64(const void* data, std::size_t n, uint64_t hash = 0xcbf29ce484222325ull);
/// `hash` as 16 hex digits: how the manifest writes checksums.
std::string hashHex(uint64_t hash);
/// FNV-1a 64 of `bytes` as 16 hex digits.
std::string fnv1a64Hex(const std::string& bytes);

/// The split a checkpoint was written under: G = m x a x W and the epoch's shape.
/// An adaptive run's is plan0 (Note [adaptive checkpoint]).
struct ManifestPlan {
  int64_t global = 0;
  int64_t per_gpu = 0;
  int64_t accum = 0;
  int64_t world_size = 0;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  int64_t dataset_size = 0;
};
ManifestPlan manifestPlan(const Plan& p);

/// What rng.pt holds (Note [rng records]): W records of the same size.
struct RngLayout {
  int64_t ranks = 0;
  int64_t cpu_bytes = 0;   ///< the largest CPU generator state of any rank
  int64_t cuda_bytes = 0;  ///< the largest CUDA generator state, 0 when no rank is on a GPU
  int64_t chunk_ranks = 0;
  /// [int64 CPU length][int64 CUDA length][CPU state][CUDA state], 8-byte aligned.
  int64_t record() const { return 16 + (cpu_bytes + 7) / 8 * 8 + (cuda_bytes + 7) / 8 * 8; }
};

/// A sharded optimizer's optimizer_state.bin (Note [sharded checkpoint]): layout "flat".
struct FlatStateEntry {
  std::vector<std::string> names;  ///< the optimizer's state vectors, in file order
  int64_t params = 0;
  int64_t elements = 0;
  std::string dtype;
  int64_t element_bytes = 0;
  int64_t ranks = 0;
  int64_t chunk_bytes = 0;
  std::string file;
};

/// The fp16 loss scaler's state.
struct ScalerEntry {
  double scale = 0;
  int64_t tracker = 0;
  int64_t skipped = 0;
};

/// A file of the checkpoint, its size and FNV-1a 64 (16 hex digits).
struct ManifestFile {
  std::string name;
  uint64_t bytes = 0;
  std::string fnv1a64;
};

/// Everything manifest.json holds but its checksum, which the writer computes.
struct CheckpointManifest {
  int format = kManifestFormat;
  std::string batchdist_version;
  std::string torch_version;
  int64_t created_unix = 0;
  // The position (Note [checkpoint]); an adaptive run's epoch, step_in_epoch and
  // lr_next are its adapt record's (Note [adaptive checkpoint]).
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t step_in_epoch = 0;
  double lr_next = 0;
  int64_t samples = 0;
  int64_t epoch_samples = 0;
  double epoch_loss_sum = 0;
  std::vector<EpochStats> history;
  ManifestPlan plan;
  int64_t searched_per_gpu = 0;  ///< the batch search's choice, 0 when not searched
  Levers levers;                 ///< in force (Note [lever search])
  std::string config_hash;       ///< FNV-1a 64 of the config's dump
  nlohmann::ordered_json config; ///< the resolved config: the user's document, kept as JSON
  std::vector<std::string> parameters;
  std::vector<std::string> buffers;
  std::optional<RngLayout> rng;  ///< none: format 1's torch archive of CPU generators
  /// batch.adapt: the trainer's record, opaque here (Note [adaptive checkpoint]); null otherwise.
  nlohmann::ordered_json adapt;
  std::optional<FlatStateEntry> optimizer_state;  ///< dist.shard: optimizer/gradients
  std::optional<ScalerEntry> loss_scaler;         ///< fp16 only
  std::vector<ManifestFile> files;
};

/// manifest.json's document: the current format's keys in their order, then
/// "checksum", FNV-1a 64 over the dump of the rest (manifestChecksum).
nlohmann::ordered_json manifestJson(const CheckpointManifest& m);

/// Reads a manifest of any format from kOldestManifestFormat on, converting the
/// older ones (Note [manifest formats]). Does not check "checksum" (the caller
/// did). Throws Error naming the key that is missing or of the wrong type, or the
/// format this batchdist does not read.
CheckpointManifest readManifest(const nlohmann::ordered_json& j);

/// The manifest's own checksum: FNV-1a 64 over its dump without the "checksum" key.
std::string manifestChecksum(nlohmann::ordered_json m);

/// The position a manifest records.
TrainPosition positionOf(const CheckpointManifest& m);

}  // namespace batchdist::worker
