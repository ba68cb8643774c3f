#include "worker/report/diagnose.h"

#include "collective/error.h"
#include "worker/common/console.h"

namespace batchdist::worker {
namespace {

double pct(double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; }

}  // namespace

std::vector<std::string> diagnose(const Config& cfg, const TrainResult& r, bool cuda,
                                  const std::string& device_name) {
  std::vector<std::string> out;
  const double total = r.time.total();
  if (total <= 0) return out;
  const double data = pct(r.time.data_wait, total);
  const double comm = pct(r.time.comm, total);
  if (data > 10) {
    out.push_back(strCat("data: ", formatFixed(data, 0), " % of step time waiting for batches (",
                         formatFixed(r.time.data_wait, 1), " s of ", formatFixed(total, 1),
                         " s); raise data.workers (now ", cfg.data.workers, ") or data.prefetch (now ",
                         cfg.data.prefetch, "), or preprocess offline"));
  }
  if (comm > 30) {
    out.push_back(strCat("communication: ", formatFixed(comm, 0),
                         " % of step time in the gradient allreduce (", formatFixed(r.time.comm, 1),
                         " s); a larger per-GPU batch or gradient accumulation (batch.accum) "
                         "amortises it"));
  }
  const double skew = pct(r.time.skew, total);
  if (skew > 15) {
    out.push_back(strCat("skew: ", formatFixed(skew, 0), " % of step time (rank 0) waiting for a "
                         "slower rank to finish its backward (", formatFixed(r.time.skew, 1),
                         " s); look for a rank with a slower device, a busier host, or a slower "
                         "data pipeline (data.workers)"));
  }
  if (cuda && r.memory_total_mb > 0 && r.peak_memory_mb < 0.5 * r.memory_total_mb) {
    out.push_back(strCat("memory: peak ", formatFixed(r.peak_memory_mb / 1024, 1), " GiB of ",
                         formatFixed(r.memory_total_mb / 1024, 1), " GiB (",
                         formatFixed(pct(r.peak_memory_mb, r.memory_total_mb), 0),
                         " %); a larger batch fits: try batch.per_gpu: auto"));
  }
  if (cuda && cfg.train.precision == Precision::kFp32) {
    out.push_back(strCat("precision: fp32 on ", device_name,
                         ", whose tensor cores run bf16/fp16 far faster; try train.precision: bf16 "
                         "(or fp16), which also halves activation memory"));
  }
  if (r.gpu_utilization >= 0 && r.gpu_utilization < 70) {
    out.push_back(strCat("utilization: the GPU was busy ", formatFixed(r.gpu_utilization, 0),
                         " % of the time (NVML); see the data and communication shares above"));
  }
  return out;
}

}  // namespace batchdist::worker
