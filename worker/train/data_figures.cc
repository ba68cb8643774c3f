#include "worker/train/data_figures.h"

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

}  // namespace

DataFigures gatherDataFigures(collective::Communicator& comm, Loader& train,
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
  // rank) count too. Note [bad files named]: the names are gathered the same way.
  f.errors = static_cast<int64_t>(data.bad_files.size());
  std::vector<std::vector<DataErrorRecord>> met;
  const auto any = comm.allreduce(static_cast<double>(decoder->errorCount()), collective::ReduceOp::kSum);
  if (any > 0) {
    auto mask = torch::zeros({data.train.size()}, torch::kFloat);
    for (const auto i : decoder->badIndices()) mask[i] = 1.0f;
    mask = mask.to(device);
    comm.allreduce(mask, collective::ReduceOp::kMax);
    f.errors += mask.gt(0).sum().item<int64_t>();
    met = allgatherErrors(comm, decoder->firstErrors());
  }
  f.first_errors = mergeDataErrors(data.bad_files, met);
  if (cache == DataCache::kRam) {
    f.cache_mb = decoder->cachedBytes() / 1048576.0;
    f.cache_hits = decoder->cacheHits();
  }
  return f;
}

}  // namespace batchdist::worker
