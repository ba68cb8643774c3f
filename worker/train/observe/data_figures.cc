#include "worker/train/observe/data_figures.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace batchdist::worker {

std::vector<std::string> allgatherText(collective::Communicator& comm, const std::string& text) {
  const auto lengths = comm.allgather(static_cast<double>(text.size()));
  int64_t longest = 1;
  for (const double n : lengths) longest = std::max(longest, static_cast<int64_t>(n));
  auto bytes = torch::zeros({longest}, torch::kByte);
  std::memcpy(bytes.data_ptr(), text.data(), text.size());
  const auto all = comm.allgather(bytes.to(comm.device())).cpu().contiguous();
  const auto* p = reinterpret_cast<const char*>(all.data_ptr());
  std::vector<std::string> out;
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    out.emplace_back(p + r * longest, static_cast<std::size_t>(lengths[r]));
  }
  return out;
}

namespace {

/// Note [bad files named]: every rank's first bad files, on every rank.
std::vector<std::vector<DataErrorRecord>> allgatherErrors(collective::Communicator& comm,
                                                          const std::vector<DataErrorRecord>& mine) {
  auto j = nlohmann::json::array();
  for (const auto& e : mine) j.push_back({e.index, e.where, e.reason});
  // A file name need not be UTF-8: such bytes become U+FFFD rather than throw.
  const auto mine_text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::vector<std::vector<DataErrorRecord>> out;
  for (const auto& text : allgatherText(comm, mine_text)) {
    auto& rank = out.emplace_back();
    for (const auto& e : nlohmann::json::parse(text)) {
      rank.push_back({e[1].get<std::string>(), e[2].get<std::string>(), e[0].get<int64_t>()});
    }
  }
  return out;
}

/// How many of `decoder`'s samples (of a set of `size`) are bad on any rank,
/// each counted once: the union of the ranks' masks. Collective.
int64_t badSamples(collective::Communicator& comm, const SampleDecoder& decoder, int64_t size,
                   at::Device device) {
  auto mask = torch::zeros({size}, torch::kFloat);
  for (const auto i : decoder.badIndices()) mask[i] = 1.0f;
  mask = mask.to(device);
  comm.allreduce(mask, collective::ReduceOp::kMax);
  return mask.gt(0).sum().item<int64_t>();
}

/// This rank's first bad files: training's, then evaluation's (said so).
std::vector<DataErrorRecord> firstErrors(const SampleDecoder& train, const SampleDecoder* val) {
  auto first = train.firstErrors();
  if (!val) return first;
  for (auto e : val->firstErrors()) {
    e.reason += " (met in evaluation)";
    first.push_back(std::move(e));
  }
  return first;
}

}  // namespace

DataFigures gatherDataFigures(collective::Communicator& comm, Loader& train, const Loader* val,
                              const DataSplit& data, DataCache cache, at::Device device) {
  DataFigures f;
  f.workers = train.workers();
  f.stages = train.takeStageSeconds();
  if (const auto busy = f.stages.read + f.stages.decode + f.stages.transform; busy > 0) {
    f.capacity_samples_per_s = f.stages.samples * std::max<int64_t>(1, f.workers) / busy;
  }
  const auto* decoder = train.decoder();
  if (!decoder) return f;
  // Every rank gets here together (the last step was agreed). A bad file met by
  // several ranks counts once: the union of the ranks' bad samples, sent as a
  // mask only when there are any. The walk's bad files (the same list on every
  // rank) count too, and so do those evaluation met (the validation loader's
  // own decoder, on every rank alike). Note [bad files named]: the names are
  // gathered the same way.
  const SampleDecoder* val_decoder = val ? val->decoder() : nullptr;
  f.errors = static_cast<int64_t>(data.bad_files.size());
  std::vector<std::vector<DataErrorRecord>> met;
  const double mine = static_cast<double>(decoder->errorCount()) +
                      (val_decoder ? static_cast<double>(val_decoder->errorCount()) : 0.0);
  if (comm.allreduce(mine, collective::ReduceOp::kSum) > 0) {
    f.errors += badSamples(comm, *decoder, data.train.size(), device);
    if (val_decoder && data.val.size() > 0) {
      f.errors += badSamples(comm, *val_decoder, data.val.size(), device);
    }
    met = allgatherErrors(comm, firstErrors(*decoder, val_decoder));
  }
  f.first_errors = mergeDataErrors(data.bad_files, met);
  if (cache == DataCache::kRam) {
    const int64_t bytes = decoder->cachedBytes() + (val_decoder ? val_decoder->cachedBytes() : 0);
    f.cache_mb = bytes / 1048576.0;
    f.cache_hits = decoder->cacheHits() + (val_decoder ? val_decoder->cacheHits() : 0);
  }
  return f;
}

}  // namespace batchdist::worker
