#pragma once
// The input pipeline's figures over a run, for report.json's `data` and
// data_errors: this rank's loader stages, and the bad files counted and named over
// every rank (Note [bad files named] in worker/data/pipeline.h).

#include <ATen/core/Tensor.h>

#include "collective/communicator.h"
#include "worker/config/config.h"
#include "worker/data/data.h"
#include "worker/data/loader.h"
#include "worker/train/result.h"

namespace batchdist::worker {

/// Every rank's `text`, indexed by rank: the lengths, then the bytes padded to the
/// longest (one allgather each, on the communicator's device). Collective.
std::vector<std::string> allgatherText(collective::Communicator& comm, const std::string& text);

/// The figures of `train`, the training loader over `data.train` (its stage
/// seconds are taken: the next call counts from here). A decoded source's bad
/// files count once however many ranks met them, the walk's (`data.bad_files`)
/// and those evaluation met (`val`, the validation loader over `data.val`; null
/// without one) included, and the first few are named whichever rank met them.
/// `cache`: data.cache (kRam adds both loaders' cache sizes and hits); `device`:
/// where the masks of bad samples are reduced (the training device).
///
/// Collective when the loader decodes (every rank must call it at the same
/// point, after the same last step, with a `val` alike): an allreduce of the
/// error counts, and when there are any, an allreduce of each loader's
/// bad-sample mask and two allgathers of the first errors. Without a decoder it
/// returns this rank's figures, no collective.
DataFigures gatherDataFigures(collective::Communicator& comm, Loader& train, const Loader* val,
                              const DataSplit& data, DataCache cache, at::Device device);

}  // namespace batchdist::worker
