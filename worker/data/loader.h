#pragma once
// Note [loader]: batches are made ahead of the training step by `workers` threads
// into a bounded queue of at most `prefetch` batches (made or being made), so
// memory is bounded whatever the data set's size. An in-memory batch is the gather
// of one micro-batch's indices (uint8 images become float; token windows int64
// ids, untransformed: Note [tokens]), then the configured transforms, seeded by
// (seed, epoch, job). A decoded source's batch is cut into
// parts of a few samples that all threads share, so even one batch in flight keeps
// every thread busy; each sample is decoded straight into the batch's uint8 NHWC
// slot with its own seed (Note [sample seeds]), and normalised after the copy to
// the device (4x fewer bytes to copy). Either way a batch is the same whichever
// thread made it and however many threads there are; the consumer takes them
// strictly in order. On CUDA, batches are staged in page-locked memory and copied with
// non_blocking on a side stream, so the copy overlaps the compute already queued;
// the random transforms then run on the GPU (their random numbers are drawn on the
// CPU from the same seeded generator).

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/config/config.h"
#include "worker/data/data.h"
#include "worker/data/pipeline.h"
#include "worker/plan/plan.h"

namespace batchdist::worker {

/// Random crop (zero padding), horizontal flip, resize and normalize, on a batch
/// [N, C, H, W] (or flat features: only normalize). Deterministic given `seed`.
struct Transform {
  int64_t crop_padding = 0;
  bool hflip = false;
  int64_t resize = 0;
  std::vector<double> mean;
  std::vector<double> std;
  /// Note [channels last] (worker/model/model.h): image batches come out NHWC in
  /// memory (still [N, C, H, W] in shape); the decoded sources are written so.
  bool channels_last = false;

  static Transform fromConfig(const DataConfig& cfg, bool training);
  bool randomOps() const { return crop_padding > 0 || hflip; }
  bool any() const { return randomOps() || resize > 0 || !mean.empty(); }
  /// Output per-sample shape for input per-sample shape `in`.
  std::vector<int64_t> outputShape(const std::vector<int64_t>& in) const;
  at::Tensor apply(const at::Tensor& x, uint64_t seed) const;
  /// `x` dense in this transform's memory format (images: channels_last or not).
  at::Tensor laidOut(const at::Tensor& x) const;
};

struct Batch {
  at::Tensor x;  ///< float, on the training device (uint8 NHWC: LoaderOptions::uint8_images; tokens: int64 ids)
  at::Tensor target;  ///< the task's targets (Task::targetDtype): int64 labels, float values
  at::Tensor w;  ///< float loss weights (0 for padding)
};

struct LoaderOptions {
  int64_t workers = 0;
  int64_t prefetch = 2;
  bool pin_memory = true;
  at::Device device = at::kCPU;
  Transform transform;  ///< decoded sources: normalisation only (crop and flip are the decoder's)
  uint64_t seed = 0;
  /// Decoded sources: reads and decodes each sample (required when data.source is set).
  std::shared_ptr<const SampleDecoder> decoder;
  int64_t part_samples = 4;  ///< decoded sources: samples per unit of work
  /// Decoded sources on the CPU: batches stay uint8 NHWC as decoded (no float
  /// conversion, no normalisation), as the CUDA path ships them to the device.
  /// The `data` verb times this (measureLoader): the input pipeline's own output.
  bool uint8_images = false;
};

/// The options of a loader for `data` as `cfg` configures it (threads: data.workers
/// resolved, or the machine's share when still auto), with a decoder for decoded
/// sources (crop and flip for training, resize + centre crop for evaluation).
/// `warn` receives each bad file's message once. `read_delay_us`: the decoder's
/// (Note [fault plan]: the tests' slow storage; 0 outside them).
LoaderOptions loaderOptions(const DataConfig& cfg, const Dataset& data, bool training,
                            at::Device device, uint64_t seed, SampleDecoder::Warn warn,
                            int64_t read_delay_us = 0);

/// Resolves data.workers: a number as given; auto: 0 (the training thread) for
/// in-memory data, else this rank's share of `cpus` less one, at least 1.
int64_t resolveWorkers(const DataConfig& cfg, int cpus, int local_ranks);

class Loader {
 public:
  Loader(const Dataset& data, LoaderOptions opts);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  /// Queues the micro-batches of an epoch, in the order next() returns them.
  /// `first_index` is the first job's index in the whole epoch (a run resumed
  /// mid-epoch starts there): the transform seeds follow (seed, epoch, index).
  void start(std::vector<MicroBatch> jobs, int64_t epoch, int64_t first_index = 0);
  /// The next batch, in order; blocks until it is ready.
  Batch next();
  /// Seconds next() spent waiting for a batch since the last call.
  double takeWaitSeconds();
  /// Most batches ever queued ahead at once (never above prefetch).
  int64_t maxQueued() const { return max_queued_; }
  /// Per-stage seconds of decoded samples since the last call (all threads summed).
  StageSeconds takeStageSeconds();
  /// The same, without resetting.
  StageSeconds stageSeconds() const;
  const SampleDecoder* decoder() const { return opts_.decoder.get(); }
  int64_t workers() const { return static_cast<int64_t>(threads_.size()); }
  /// Seconds the worker threads have spent making batches (all threads summed,
  /// never reset): their busy share is its growth over workers x wall time.
  double busySeconds() const;

 private:
  struct Building;
  int64_t partsOf(const MicroBatch& job) const;
  /// CPU training on a decoded source: fill() writes normalised float NCHW.
  bool floatImages() const;
  /// Slot `slot` of `b` takes sample `index`'s target (Note [replacement's target]).
  void takeTarget(Batch* b, int64_t slot, int64_t index) const;
  Batch allocate(const MicroBatch& job) const;
  /// Fills part `part` of `b` (in-memory: the whole batch).
  void fill(const MicroBatch& job, int64_t part, int64_t index, int64_t epoch, Batch* b);
  /// After the last part: CPU-side conversion and pinning.
  void finish(Batch* b, int64_t index, int64_t epoch) const;
  Batch toDevice(Batch host) const;
  void work();

  const Dataset& data_;
  LoaderOptions opts_;
  std::vector<MicroBatch> jobs_;
  int64_t epoch_ = 0;
  int64_t first_index_ = 0;  // index of jobs_[0] in the epoch
  int64_t generation_ = 0;   // bumped by start(): a batch of an older one is dropped
  int64_t next_job_ = 0;     // next job a worker takes
  int64_t next_part_ = 0;    // ... and its next part
  std::map<int64_t, std::shared_ptr<Building>> building_;  // jobs with parts in progress
  StageSeconds stages_;
  double busy_s_ = 0;        // worker threads' time in fill() and finish()
  int64_t consumed_ = 0;     // next job the consumer returns
  std::map<int64_t, Batch> ready_;
  int64_t max_queued_ = 0;
  double wait_s_ = 0;
  bool stop_ = false;
  std::map<int64_t, std::exception_ptr> errors_;  // job index -> its failure
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
};

}  // namespace batchdist::worker
