#pragma once
// Checkpoints: format, write, verify, load, retention. The resume decision (which
// checkpoint, whether this run may continue it, the plan for the new world size)
// lives in worker/run.cc.
//
// Note [checkpoint]: a checkpoint is a directory DIR/step-NNNNNNNN holding
//   model.pt      every parameter and buffer (rank 0's: after a step they are the
//                 same on every rank, except BatchNorm running statistics, which
//                 evaluation takes from rank 0 anyway)
//   optimizer.pt  the optimizer's state (SGD momentum, Adam moments and step
//                 counts, LARS momentum), restored into the optimizer's own tensors;
//                 under dist.shard: optimizer optimizer_state.bin instead, written
//                 by slices (Note [sharded checkpoint])
//   rng.pt        every rank's CPU generator (dropout) and, on GPUs, its CUDA
//                 generator (Note [cuda rng] in common/device_compat.h), as
//                 records (Note [rng records]); restored only when the world size
//                 is the same, since rank r's streams belong to rank r. On another
//                 world size every rank keeps the streams its seed gave it (train
//                 seed + rank, CPU and CUDA alike): bitwise resume is promised on
//                 the same world size only. A CUDA state is restored only on a GPU;
//                 a checkpoint written on CPUs leaves the CUDA generator seeded.
//   manifest.json the position (global step; epoch and step in it follow from the
//                 plan), the plan (G, m, a, W), the searched per-GPU batch, the
//                 fp16 loss scaler, the resolved config and its hash, batchdist and
//                 torch versions, what rng.pt holds ("rng": ranks, cpu, cuda, the
//                 state and record sizes), and the size and FNV-1a 64 of every
//                 other file; its own FNV-1a 64 over the rest of it.
// Atomicity: all ranks agree on the step first (a checkpoint is taken after the
// same optimizer step everywhere: the wish rides in the gradient allreduce).
// Rank 0 writes every file into DIR/.tmp-step-NNNNNNNN-PID, fsyncs each file and
// the directory, renames it to step-NNNNNNNN, fsyncs DIR, and only then rewrites
// DIR/latest (itself written atomically; a pointer for people and tools: resume
// scans the step-* directories, newest first, and verifies each). So a directory
// named step-* is complete
// unless its bytes were damaged later, and verification catches that: a
// checkpoint whose manifest is missing, unparsable or fails its checksum, or whose
// file is missing, of another size or fails its checksum, is never loaded; resume
// names it, says why, and takes the next older one. Nothing older than the one
// being written is touched before the rename; retention then removes all but
// the newest `keep`. Checkpoints newer than the one written belong to a timeline
// that a resume from an older checkpoint abandoned, and are removed too.
// Position: a resumed run starts epoch e = step / steps_per_epoch at step
// s = step % steps_per_epoch of the same permutation (G is kept, so both are the
// same for any world size), and hands the loader the same job indices as an
// uninterrupted epoch (Loader::start's first_index), so the per-batch transform
// seeds match on the same world size and accumulation.
// rng.pt's layout: Note [rng records] in worker/train/checkpoint/rng_records.h; the
// manifest's type and formats: worker/train/checkpoint/manifest.h.

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <thread>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "worker/common/faults.h"
#include "worker/config/config.h"
#include "worker/plan/plan.h"
#include "worker/train/checkpoint/manifest.h"
#include "worker/train/result.h"

namespace batchdist::worker {

class Console;
class Model;
class Optimizer;
class LossScaler;

/// "step-00000040" for step 40.
std::string checkpointName(int64_t step);

/// The step-* directories under `dir`, newest first (by step).
std::vector<std::pair<int64_t, std::string>> listCheckpoints(const std::string& dir);

/// A dist.shard optimizer's state file (Note [sharded checkpoint]).
constexpr char kStateFile[] = "optimizer_state.bin";
/// The largest checkpoint file a resume reads into memory.
constexpr std::uintmax_t kMaxCheckpointFile = std::uintmax_t{1} << 40;

/// The live state a checkpoint saves and restores (the trainer's).
struct TrainState {
  Model* model = nullptr;
  Optimizer* optimizer = nullptr;
  LossScaler* scaler = nullptr;  ///< fp16 only
  at::Device device = at::kCPU;
};

/// What a run's checkpoints record about the run itself.
struct CheckpointIdentity {
  Plan plan;
  int64_t searched_per_gpu = 0;      ///< the batch search's choice, 0 when not searched
  nlohmann::ordered_json config;     ///< the resolved config
  Levers levers;                     ///< in force (Note [lever search]: the search's under auto)
};

// Note [background checkpoint]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An elastic job loses the steps since its last checkpoint, so checkpoints must
// be cheap enough to take every few steps. What needs the ranks (the agreed
// step, rng.pt and a sharded state gathered to rank 0) and what reads the live
// tensors (model.pt and optimizer.pt serialised into memory, the manifest) is
// done at the step boundary as before; the rest, rank 0's writing, fsyncs, the
// rename and `latest`, runs on a thread while training goes on
// (checkpoint.background: true, the default). One write is in flight at most: a
// checkpoint due while the previous one is still being written waits for it.
// The outcome (the console line, or the error: training goes on, earlier
// checkpoints untouched) comes at the next step after it finished, and
// retention runs then. A checkpoint taken because a stop signal ends the run is
// written in the foreground and its outcome agreed by every rank (a stop whose
// checkpoint failed exits 1), and so is every write with background: false. A
// record's `seconds` is what the step waited; `write_seconds` the writing.

// Note [checkpoint interval]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// checkpoint.every_steps: auto (what `batchdist elastic` sets when the config sets
// no step interval: an elastic job loses the steps since its last checkpoint)
// checkpoints as often as it can for at most kAutoShare (1 %) of the training
// time: after each checkpoint the interval becomes k = ceil(w / (0.01 t)), w what
// the step waited for it (Note [background checkpoint]: the state's copy, plus any
// wait for the previous write) and t the recent step time. So a cheap checkpoint
// is taken every few steps and an expensive one rarely, and a write that cannot
// keep up lengthens the interval by itself. The first comes after the first step
// (it measures w). Rank 0 decides; the wish rides in the gradient allreduce like
// every_minutes'.
constexpr double kAutoShare = 0.01;

/// Writes this run's checkpoints (rank 0 writes; every call is collective).
class Checkpointer {
 public:
  /// `faults`: the tests' checkpoint kill (Note [fault plan]), copied; null: none.
  Checkpointer(const CheckpointConfig& cfg, std::string dir, CheckpointIdentity id,
               collective::Communicator& comm, const FaultPlan* faults = nullptr);
  /// Waits for a write in flight (Note [background checkpoint]).
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  const std::string& dir() const { return dir_; }
  /// The split training uses from now on (Note [oom back-off]): later checkpoints
  /// record it, so a resume continues with it.
  void setPlan(const Plan& plan) { id_.plan = plan; }
  /// Whether the step just done (`global_step` steps in all) is due by every_steps.
  bool dueBySteps(int64_t global_step) const;
  /// Rank 0's wish by every_minutes (local; the trainer agrees it over the ranks).
  bool dueByTime() const;
  /// Rank 0's wish by every_steps: auto after `steps_done` steps (Note
  /// [checkpoint interval]; local, agreed like dueByTime).
  bool dueByAuto(int64_t steps_done) const;
  /// Rank 0: a training step took `seconds` (for every_steps: auto).
  void noteStep(double seconds);
  /// every_steps: auto's interval now (1 before the first checkpoint measured it).
  int64_t autoInterval() const { return auto_every_; }
  bool onSignal() const { return cfg_.on_signal; }

  /// Writes a checkpoint of `state` after `pos.global_step` steps. Collective.
  /// I/O failures do not throw: the record carries the cause (every rank learns
  /// it), rank 0 prints it, and earlier checkpoints are untouched.
  CheckpointRecord save(const TrainState& state, const TrainPosition& pos, bool on_signal,
                        Console& console);
  /// Rank 0: a background write that has finished is reported (its line or its
  /// error) and retention runs; cheap when none has. Local.
  void poll(Console& console);
  /// Rank 0: waits for the write in flight and reports it; then fills in the
  /// outcome (error, bytes, write_seconds) of `records` written in the
  /// background. Local.
  void settle(Console& console, std::vector<CheckpointRecord>* records = nullptr);

  /// rng.pt is gathered to rank 0 in pieces of at most this many bytes (Note
  /// [rng records]); 1 MiB unless a test asks for less.
  void setRngChunkBytes(std::size_t bytes) { rng_chunk_bytes_ = bytes; }
  /// A sharded optimizer's state likewise (Note [sharded checkpoint]); 16 MiB.
  void setStateChunkBytes(std::size_t bytes) { state_chunk_bytes_ = bytes; }

 private:
  /// Rank 0: a fresh DIR/.tmp-step-NNNNNNNN-PID.
  std::string makeTemporary(int64_t step) const;
  /// What a write needs once the tensors are serialised: no torch state, no ranks.
  /// rng.pt and a sharded optimizer_state.bin are in `tmp` already, and in the
  /// manifest's files.
  struct Prepared {
    int64_t step = 0;
    std::string tmp, final_path;
    std::vector<std::pair<std::string, std::string>> files;  ///< name, bytes
    CheckpointManifest manifest;  ///< its files: those already in tmp
  };
  /// Collective: the temporary directory (rank 0), rng.pt and a sharded state
  /// streamed into it, then prepare(). A failure on rank 0 lands in `error` (the
  /// temporary removed) and stops the writing, not the collectives.
  Prepared gather(const TrainState& state, const TrainPosition& pos, const std::string& final_path,
                  std::string& error);
  /// The manifest of a checkpoint of `state` at `pos` (its rng, optimizer_state
  /// and files are the caller's).
  CheckpointManifest manifestOf(const TrainState& state, const TrainPosition& pos) const;
  /// `p` with the files' bytes of a checkpoint of `state` (the live tensors are
  /// read here).
  void prepare(const TrainState& state, Prepared& p) const;
  /// Note [background checkpoint]: hands `p` to the writer thread (rank 0).
  CheckpointRecord writeInBackground(CheckpointRecord rec, Prepared p, const std::string& error,
                                     double t0, Console& console);
  /// A write the step waits for, its outcome agreed by every rank.
  CheckpointRecord writeInForeground(CheckpointRecord rec, const Prepared& p, std::string error,
                                     double t0, Console& console);
  /// Every file into `p.tmp`, fsynced; the rename; `latest`. Returns the bytes
  /// written; on failure removes `p.tmp` and rethrows. Touches nothing but the
  /// file system: runs on the writer thread.
  int64_t commit(const Prepared& p) const;
  int64_t commitFiles(const Prepared& p) const;  ///< commit() without the clean-up
  /// Rank 0: the line (or the error) for a finished write, and retention.
  void report(const CheckpointRecord& rec, Console& console) const;
  void prune(int64_t written_step, Console& console) const;

  CheckpointConfig cfg_;
  std::string dir_;
  CheckpointIdentity id_;
  collective::Communicator& comm_;
  CheckpointFault fault_;  ///< Note [fault plan]: where a test kills the write
  double last_write_ = 0;  ///< monotonic seconds of the last write (or the start)
  std::size_t rng_chunk_bytes_ = std::size_t{1} << 20;
  std::size_t state_chunk_bytes_ = std::size_t{16} << 20;
  // Note [checkpoint interval]
  double step_s_ = 0;           ///< rank 0: recent step time (moving average)
  int64_t last_step_ = -1;      ///< the step of the last checkpoint taken
  int64_t auto_every_ = 1;
  void updateAutoInterval(double waited_s, Console& console);
  // Note [background checkpoint]: the write in flight and the finished ones' outcomes.
  std::thread writer_;
  std::atomic<bool> writer_done_{false};
  CheckpointRecord in_flight_;  ///< written by the writer thread until writer_done_
  std::map<int64_t, CheckpointRecord> finished_;  ///< background writes by step
};

/// A checkpoint directory checked against its manifest.
struct CheckpointCheck {
  std::string path;
  CheckpointManifest manifest;  ///< valid only when problem is empty
  std::string text;             ///< manifest.json as read (rank 0 broadcasts it)
  std::string problem;          ///< why it must not be loaded, or empty
};

/// Checks `path` (a step-* directory): manifest present, parsable and intact,
/// every file present with its size and checksum. Never throws.
CheckpointCheck verifyCheckpoint(const std::string& path);

/// The newest valid checkpoint under `dir`, if any; each newer one rejected is
/// appended to `rejected` as "PATH: why".
std::optional<CheckpointCheck> findLatestCheckpoint(const std::string& dir,
                                                    std::vector<std::string>* rejected);

/// Restores the model, the optimizer, the fp16 loss scaler and, when the world
/// size is the one the checkpoint was written with, this rank's CPU generator and
/// (on a GPU, when the checkpoint has one) its CUDA generator (Note [rng records]).
/// Every rank reads the files (the directory must be visible to all ranks).
/// Throws Error when a file does not fit this model or optimizer.
void restoreState(const CheckpointCheck& ckpt, const TrainState& state, int rank, int world);

/// Refuses (ConfigError naming the key, exit 2) to continue a checkpoint whose
/// model, optimizer, data, seed or global batch differ from this run's; world
/// size, per-GPU batch, accumulation, epochs and the rest may differ.
void checkResumable(const CheckpointManifest& manifest, const Config& cfg,
                    const std::string& path);

}  // namespace batchdist::worker
