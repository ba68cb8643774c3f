#include "worker/train/observe/system_figures.h"

#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "common/host.h"
#include "worker/train/observe/data_figures.h"

namespace batchdist::worker {

std::unique_ptr<SystemSampler> makeSystemSampler(const ReportConfig& cfg, at::Device device,
                                                 int rank, const Loader& train) {
  if (cfg.sample_s <= 0) return nullptr;
  SystemSamplerOptions o;
  o.interval_s = cfg.sample_s;
  o.rank = rank;
  const char* library = std::getenv("BATCHDIST_NVML_LIBRARY");
  const bool named = library && *library;
  if (device.is_cuda() || named) o.nvml_library = named ? library : "libnvidia-ml.so.1";
  o.cuda_index = device.is_cuda() ? static_cast<int>(device.index()) : 0;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (device.is_cuda() && visible) o.visible_devices = visible;
  if (train.workers() > 0) {
    o.loader_threads = train.workers();
    o.loader_busy_seconds = [loader = &train] { return loader->busySeconds(); };
  }
  return std::make_unique<SystemSampler>(std::move(o));
}

std::vector<RankSystem> gatherSystemFigures(collective::Communicator& comm,
                                            std::unique_ptr<SystemSampler> sampler,
                                            std::vector<SystemPoint> series) {
  sampler->stop();
  RankSystem mine;
  mine.rank = comm.rank();
  mine.host = hostName();
  mine.run = sampler->run();
  mine.series = thinnedSeries(std::move(series), kSystemSeriesPoints);
  mine.unread = sampler->unread();
  sampler.reset();
  const auto text = rankSystemJson(mine).dump(-1, ' ', false,
                                              nlohmann::ordered_json::error_handler_t::replace);
  const auto all = allgatherText(comm, text);
  std::vector<RankSystem> out;
  if (comm.rank() != 0) return out;
  for (const auto& rank_text : all) {
    out.push_back(rankSystemFromJson(nlohmann::json::parse(rank_text)));
  }
  return out;
}

}  // namespace batchdist::worker
