#include "worker/data/measure.h"

#include <algorithm>
#include <cstdio>

#include "worker/common/console.h"
#include "worker/common/util.h"
#include "worker/data/loader.h"

namespace batchdist::worker {

nlohmann::ordered_json LoaderMeasurement::json() const {
  nlohmann::ordered_json j;
  j["rank"] = rank;
  j["samples_per_s"] = samplesPerSecond();
  j["samples"] = samples;
  j["batches"] = batches;
  j["seconds"] = seconds;
  j["workers"] = workers;
  j["per_gpu"] = per_gpu;
  j["wait_s"] = wait_s;
  j["read_s"] = stages.read;
  j["decode_s"] = stages.decode;
  j["transform_s"] = stages.transform;
  j["bytes"] = stages.bytes;
  j["bytes_per_s"] = seconds > 0 ? stages.bytes / seconds : 0.0;
  j["errors"] = errors;
  j["output"] = output;
  return j;
}

LoaderMeasurement LoaderMeasurement::fromJson(const nlohmann::json& j) {
  LoaderMeasurement m;
  m.rank = j.at("rank");
  m.samples = j.at("samples");
  m.batches = j.at("batches");
  m.seconds = j.at("seconds");
  m.workers = j.at("workers");
  m.per_gpu = j.at("per_gpu");
  m.wait_s = j.at("wait_s");
  m.stages.read = j.at("read_s");
  m.stages.decode = j.at("decode_s");
  m.stages.transform = j.at("transform_s");
  m.stages.bytes = j.at("bytes");
  m.errors = j.at("errors");
  m.output = j.value("output", "float");
  return m;
}

LoaderMeasurement measureLoader(const Config& cfg, const Dataset& train, const Plan& plan, int rank,
                                double seconds, bool uint8_images, int64_t read_delay_us) {
  const auto warn = [rank](const std::string& w) {
    std::fprintf(stderr, "[rank %d] warning: %s\n", rank, w.c_str());
  };
  auto opts = loaderOptions(cfg.data, train, /*training=*/true, at::kCPU,
                            static_cast<uint64_t>(cfg.train.seed), warn, read_delay_us);
  opts.uint8_images = uint8_images && train.source != nullptr;
  Loader loader(train, opts);
  Sharder sharder(plan, static_cast<uint64_t>(cfg.train.seed));
  LoaderMeasurement m;
  m.rank = rank;
  m.workers = loader.workers();
  m.output = opts.uint8_images ? "uint8" : "float";
  m.per_gpu = plan.per_gpu;
  double t0 = 0;
  bool warm = false;
  for (int64_t epoch = 0;; ++epoch) {
    sharder.setEpoch(epoch);
    std::vector<MicroBatch> jobs;
    for (int64_t s = 0; s < plan.steps_per_epoch; ++s) {
      for (int64_t k = 0; k < plan.accum; ++k) jobs.push_back(sharder.micro(s, k, rank));
    }
    const auto count = jobs.size();
    loader.start(std::move(jobs), epoch);
    for (std::size_t i = 0; i < count; ++i) {
      const auto b = loader.next();
      if (!warm) {  // the first batch pays for thread start-up and cold caches
        warm = true;
        loader.takeStageSeconds();
        loader.takeWaitSeconds();
        t0 = monotonicSeconds();
        continue;
      }
      m.samples += b.x.size(0);
      m.batches += 1;
      m.seconds = monotonicSeconds() - t0;
      if (m.seconds >= seconds) break;
    }
    if (m.seconds >= seconds || count == 0) break;
  }
  m.stages = loader.takeStageSeconds();
  m.wait_s = loader.takeWaitSeconds();
  m.errors = loader.decoder() ? loader.decoder()->errorCount() : 0;
  return m;
}

std::string dataReport(const std::vector<LoaderMeasurement>& ranks, const DataSplit& data,
                       const Config& cfg, bool json, int64_t tokens_per_sample) {
  const auto tokens = static_cast<double>(tokens_per_sample);
  double total = 0, bytes = 0;
  StageSeconds stages;
  int64_t errors = static_cast<int64_t>(data.bad_files.size()), workers = 0;
  for (const auto& r : ranks) {
    total += r.samplesPerSecond();
    bytes += r.seconds > 0 ? r.stages.bytes / r.seconds : 0;
    stages.add(r.stages);
    errors += r.errors;
    workers = std::max(workers, r.workers);
  }
  if (json) {
    nlohmann::ordered_json j;
    j["source"] = toString(cfg.data.name);
    j["origin"] = data.origin;
    j["samples"] = data.train.size();
    j["classes"] = data.train.classes;
    j["world_size"] = ranks.size();
    j["samples_per_s"] = total;
    if (tokens > 0) {
      j["tokens_per_sample"] = tokens_per_sample;
      j["tokens_per_s"] = total * tokens;
    }
    j["bytes_per_s"] = bytes;
    j["workers"] = workers;
    j["output"] = ranks.empty() ? "float" : ranks[0].output;
    j["per_rank"] = nlohmann::ordered_json::array();
    for (const auto& r : ranks) {
      auto one = r.json();
      if (tokens > 0) one["tokens_per_s"] = r.samplesPerSecond() * tokens;
      j["per_rank"].push_back(one);
    }
    j["data_errors"] = errors;
    return j.dump(2) + "\n";
  }
  std::string out = strCat("data: ", data.origin, ": ", data.train.size(), " train samples, ",
                           data.train.classes, " classes\n");
  if (tokens > 0) {
    // What tokens/s counts: the trainer's tokens of a sample (Note [tokens per
    // sample]), not the seq_len + 1 a window reads (consecutive windows share one).
    out += strCat("  tokens: ", tokens_per_sample, " per sample (model.seq_len: the next-token "
                  "targets a window of ", tokens_per_sample, " + 1 tokens trains on); tokens/s = "
                  "samples/s x ", tokens_per_sample, ", as in training\n");
  }
  for (const auto& r : ranks) {
    const double busy = std::max(1e-12, r.stages.read + r.stages.decode + r.stages.transform);
    char line[512];
    std::snprintf(line, sizeof line,
                  "rank %d: %.1f samples/s%s (%lld %s batches of %lld, %.1f s, %lld thread(s)), "
                  "%.1f MB/s; thread time: read %.0f%%, decode %.0f%%, transform %.0f%%; "
                  "waited %.0f%% of the time\n",
                  r.rank, r.samplesPerSecond(),
                  tokenRate(r.samplesPerSecond(), tokens_per_sample).c_str(),
                  static_cast<long long>(r.batches),
                  r.output.c_str(), static_cast<long long>(r.per_gpu), r.seconds, static_cast<long long>(r.workers),
                  r.seconds > 0 ? r.stages.bytes / r.seconds / 1e6 : 0.0,
                  100 * r.stages.read / busy, 100 * r.stages.decode / busy,
                  100 * r.stages.transform / busy, r.seconds > 0 ? 100 * r.wait_s / r.seconds : 0.0);
    out += line;
  }
  char line[256];
  std::snprintf(line, sizeof line, "total: %.1f samples/s%s over %zu rank(s)%s\n", total,
                tokenRate(total, tokens_per_sample).c_str(), ranks.size(),
                errors ? strCat(", ", errors, " bad file(s) skipped").c_str() : "");
  out += line;
  return out;
}

}  // namespace batchdist::worker
