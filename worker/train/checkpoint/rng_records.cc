#include "worker/train/checkpoint/rng_records.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "collective/torch_compat.h"
#include "common/error.h"
#include "worker/common/files.h"
#include "worker/common/util.h"
#include "worker/model/archive.h"
#include "worker/train/checkpoint/checkpoint.h"

namespace batchdist::worker {
namespace {

constexpr char kRngMagic[8] = {'b', 'd', 'r', 'n', 'g', '0', '0', '2'};
constexpr int64_t kRngHeaderBytes = 32;  // magic, ranks, CPU state bytes, CUDA state bytes

int64_t roundUp8(int64_t n) { return (n + 7) / 8 * 8; }

/// This rank's record, laid out as Note [rng records] says.
std::vector<char> ownRecord(const RngLayout& l, const at::Tensor& cpu, const at::Tensor& cuda) {
  std::vector<char> mine(static_cast<std::size_t>(l.record()), 0);
  const int64_t lengths[2] = {cpu.numel(), cuda.numel()};
  std::memcpy(mine.data(), lengths, sizeof lengths);
  std::memcpy(mine.data() + 16, cpu.data_ptr(), cpu.numel());
  if (cuda.numel() > 0) std::memcpy(mine.data() + 16 + roundUp8(l.cpu_bytes), cuda.data_ptr(), cuda.numel());
  return mine;
}

}  // namespace

RngLayout gatherRng(collective::Communicator& comm, const at::Device& device,
                    std::size_t chunk_bytes,
                    const std::function<void(const char*, std::size_t)>& sink) {
  const auto cpu = compat::cpuRngState().contiguous();
  const auto cuda = compat::cudaRngState(device).to(at::kCPU).contiguous();
  const auto most = comm.allreduce(
      {static_cast<double>(cpu.numel()), static_cast<double>(cuda.numel())},
      collective::ReduceOp::kMax);
  RngLayout l;
  l.ranks = comm.size();
  l.cpu_bytes = static_cast<int64_t>(most[0]);
  l.cuda_bytes = static_cast<int64_t>(most[1]);
  const int64_t record = l.record();
  l.chunk_ranks = std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes) / record);
  const std::vector<char> mine = ownRecord(l, cpu, cuda);
  if (comm.rank() == 0) {
    int64_t header[4] = {0, l.ranks, l.cpu_bytes, l.cuda_bytes};
    std::memcpy(header, kRngMagic, sizeof kRngMagic);
    sink(reinterpret_cast<const char*>(header), sizeof header);
  }
  for (int64_t first = 0; first < l.ranks; first += l.chunk_ranks) {
    const int64_t n = std::min(l.chunk_ranks, l.ranks - first);
    // Rows of ranks outside this chunk are zeros: the sum is every member's record,
    // bit for bit (int64 words, each added to zeros only).
    auto chunk = at::zeros({n * record / 8}, at::TensorOptions().dtype(at::kLong));
    if (comm.rank() >= first && comm.rank() < first + n) {
      std::memcpy(static_cast<char*>(chunk.data_ptr()) + (comm.rank() - first) * record,
                  mine.data(), mine.size());
    }
    auto on_device = chunk.to(comm.device());
    comm.allreduce(on_device, collective::ReduceOp::kSum);
    if (comm.rank() == 0) {
      const auto host = on_device.to(at::kCPU).contiguous();
      sink(static_cast<const char*>(host.data_ptr()), static_cast<std::size_t>(n * record));
    }
  }
  return l;
}

namespace {

/// Format 1's rng.pt (before Note [rng records]): a torch archive of every rank's
/// CPU generator, "r<rank>"; read whole.
void restoreRngArchive(const std::string& dir, int rank) {
  torch::serialize::InputArchive archive;
  const auto path = (std::filesystem::path(dir) / "rng.pt").string();
  loadArchiveBytes(archive, readFileBounded(path, kMaxCheckpointFile, "checkpoint file"), at::kCPU);
  torch::Tensor t;
  archive.read(strCat("r", rank), t, /*is_buffer=*/true);
  compat::setCpuRngState(t.to(torch::kByte));
}

/// This rank's record of rng.pt (Note [rng records]): the header and one record
/// are read, whatever W is. The CUDA state is restored on a GPU when present.
void restoreRngRecord(const std::string& dir, const RngLayout& layout, int rank,
                      const at::Device& device) {
  const std::string path = (std::filesystem::path(dir) / "rng.pt").string();
  std::ifstream in(path, std::ios::binary);
  int64_t header[4] = {};
  in.read(reinterpret_cast<char*>(header), sizeof header);
  RngLayout l;
  l.ranks = header[1];
  l.cpu_bytes = header[2];
  l.cuda_bytes = header[3];
  if (!in || std::memcmp(header, kRngMagic, sizeof kRngMagic) != 0 ||
      l.ranks != layout.ranks || l.cpu_bytes < 0 || l.cuda_bytes < 0 ||
      l.record() != layout.record() || rank >= l.ranks) {
    throw Error(strCat(path, ": not the generator records its manifest describes (",
                       l.ranks, " ranks, record ", l.record(), " bytes; rank ", rank,
                       "); the checkpoint is damaged: resume from an older one or start fresh"));
  }
  std::vector<char> record(static_cast<std::size_t>(l.record()));
  in.seekg(kRngHeaderBytes + rank * l.record());
  in.read(record.data(), static_cast<std::streamsize>(record.size()));
  int64_t lengths[2] = {};
  std::memcpy(lengths, record.data(), sizeof lengths);
  if (!in || lengths[0] < 0 || lengths[0] > l.cpu_bytes || lengths[1] < 0 ||
      lengths[1] > l.cuda_bytes) {
    throw Error(strCat(path, ": rank ", rank, "'s generator record is truncated or damaged; "
                       "resume from an older checkpoint or start fresh"));
  }
  const auto bytes = [&](int64_t offset, int64_t n) {
    auto t = at::empty({n}, at::TensorOptions().dtype(at::kByte));
    std::memcpy(t.data_ptr(), record.data() + offset, static_cast<std::size_t>(n));
    return t;
  };
  compat::setCpuRngState(bytes(16, lengths[0]));
  // Note [cuda rng]: a checkpoint written on CPUs has none; one written on GPUs
  // and resumed on CPUs has no GPU to give it to.
  if (lengths[1] > 0) compat::setCudaRngState(device, bytes(16 + roundUp8(l.cpu_bytes), lengths[1]));
}

}  // namespace

void restoreRng(const std::string& dir, const std::optional<RngLayout>& layout, int rank,
                const at::Device& device) {
  if (layout) {
    restoreRngRecord(dir, *layout, rank, device);
  } else {
    restoreRngArchive(dir, rank);
  }
}

}  // namespace batchdist::worker
