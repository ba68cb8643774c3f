#pragma once
// TensorBoard event files written as the run goes (Note [tensorboard events]).

#include <cstdint>
#include <utility>
#include <vector>

#include "worker/report/event_file.h"
#include "worker/search/search.h"
#include "worker/train/result.h"

namespace batchdist::worker {

// Note [tensorboard events]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// With report.tensorboard (the default) rank 0 writes OUTPUT/tensorboard/train/
// events.out.tfevents.<unix seconds>.<host>, the file TensorBoard reads, so
// `tensorboard --logdir OUTPUT/tensorboard` shows the run, as the run "train",
// while it trains (TensorBoard names a run by its directory under the logdir:
// files in the logdir itself would be the run ".").
//
// Framing (TFRecord): each record is the data's length as uint64 little-endian,
// the masked CRC-32C of those 8 bytes, the data, and the masked CRC-32C of the
// data (both uint32 little-endian). mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8,
// so a CRC of bytes that hold CRCs is not itself trivially related to them.
// The data is an Event message (worker/report/tensorboard_event.proto: the same
// field numbers as TensorBoard's event.proto and summary.proto) serialised by
// the protobuf library. The first event of a file is {wall_time, file_version:
// "brain.Event:2"}; version 2 tells TensorBoard to honour SessionLog events.
//
// Tags: one Event per metrics point (the same points as metrics.jsonl, Note
// [streamed metrics]), step = the global steps done, one Summary value per tag:
//   train/loss train/lr train/samples_per_s        a logging interval
//   batch/global batch/per_gpu batch/accum          the split in force
//   time/data_wait time/compute time/communication time/skew   shares of the
//                                                   interval's time, 0..1
//   memory/peak_mb  noise/B_simple (only once known, > 0)
//   system/<key>    rank 0's system metrics over the interval, the ones read
//                   (Note [system metrics]: system/gpu_util_pct, system/cpu_host_pct ...)
//   train/tokens_per_s batch/global_tokens          samples that are tokens only
//                                                   (Note [tokens per sample])
// and at an epoch's end, at the same step, eval/loss and the task's eval/<metric> (eval/accuracy)
// train/epoch_loss train/epoch_samples_per_s (train/epoch_tokens_per_s) (the
// epoch's own names, so that a step that ends an epoch never has two values under
// one tag). The batch search is a run of its own, OUTPUT/tensorboard/search/:
// search/samples_per_s (search/tokens_per_s) and
// search/peak_memory_mb at step = the candidate's per-GPU batch, for the
// candidates that fit; nothing when the search was cached or not run. It cannot
// share the training run: its steps are batch sizes, and a resume's purge (below)
// would delete the candidates above the resumed step.
//
// Streaming and resume: each event is one write(2) to a file opened O_APPEND,
// so kill -9 loses at most the event being written (TensorBoard stops reading a
// file at a torn record). Every file, after its version event, opens with a
// SessionLog START at the first step it can hold: 0 for a fresh run, resumed
// step + 1 for a run resumed from a checkpoint, which writes a NEW file (files
// are read in name order, and the name holds the time; a name already taken in
// the same second gets a suffix .001, .002 ... that sorts after it). On a START,
// TensorBoard's event accumulator purges every event it already holds whose step
// is >= the START's step (event_accumulator.py, _CheckForRestartAndMaybePurge ->
// _Purge keeps x.step < event.step): the killed run's steps after its checkpoint,
// which the resumed run makes again, are dropped, and the steps up to the
// checkpoint are kept, as in metrics.jsonl (START at the resumed step itself would
// drop that step's points, which no run writes again). TensorBoard 2.21's Python
// loader and its Rust data server (--load_fast) both purge so. A fresh run into an OUTPUT that
// holds an earlier run's files purges all of them (START at 0). A new search
// file likewise replaces an earlier search. Files are never rewritten or deleted.
//
// A file that cannot be created or written costs the run one warning on stderr
// (naming the file and the cause), never the run.

/// The scalars of one metrics point (the tags of Note [tensorboard events]).
std::vector<Scalar> metricScalars(const MetricPoint& m);

/// The search's series: (per-GPU batch, scalars) for each candidate that fit,
/// by batch size; none when the result was cached.
std::vector<std::pair<int64_t, std::vector<Scalar>>> searchScalars(const SearchResult& r);

/// Appends the scalars of one metrics point to `w`.
inline void appendMetrics(EventFileWriter& w, const MetricPoint& m) {
  w.scalars(m.step, metricScalars(m));
}

/// Writes the search's series to `dir` (normally OUTPUT/tensorboard/search): a
/// new file opening with START at 0, so it replaces an earlier search in
/// TensorBoard. Nothing when the result was cached or no candidate fit. Warns, never throws.
void writeSearchEvents(const std::string& dir, const SearchResult& r);

}  // namespace batchdist::worker
