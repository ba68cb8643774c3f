#include "worker/train/checkpoint/sharded_checkpoint.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <utility>

#include "common/error.h"
#include "worker/train/shard/sharded_optimizer.h"

namespace batchdist::worker {
namespace {

constexpr char kMagic[8] = {'b', 'd', 'o', 'p', 't', '0', '0', '1'};
constexpr int64_t kHeaderWords = 8;

struct FlatHeader {
  int64_t vectors = 0;        ///< K
  int64_t params = 0;         ///< P
  int64_t elements = 0;       ///< N
  int64_t element_bytes = 0;
  int64_t dtype = 0;          ///< at::ScalarType
  int64_t dataOffset() const { return (kHeaderWords + params) * 8; }
  int64_t vectorBytes() const { return elements * element_bytes; }
};

/// Runs of this rank's pieces that are consecutive in the packed space, as
/// [first, end) piece indices: one under ZeRO-1, about one per segment under
/// ZeRO-2 (Note [shard layout]).
std::vector<std::pair<std::size_t, std::size_t>> packedRuns(const std::vector<ShardPiece>& pieces) {
  std::vector<std::pair<std::size_t, std::size_t>> runs;
  for (std::size_t j = 0; j < pieces.size(); ++j) {
    if (!runs.empty() && pieces[j - 1].packed + pieces[j - 1].length == pieces[j].packed) {
      runs.back().second = j + 1;
    } else {
      runs.emplace_back(j, j + 1);
    }
  }
  return runs;
}

/// Bytes of a packed vector that this rank holds: from byte `begin`, `values`.
struct HeldBytes {
  int64_t begin = 0;
  at::Tensor values;  ///< on the CPU, contiguous
};

/// This rank's parts of vector k, a run of pieces each, on the CPU.
std::vector<HeldBytes> heldOf(ShardedOptimizer& opt, std::size_t k, int64_t element_bytes) {
  std::vector<HeldBytes> out;
  for (const auto& [first, end] : packedRuns(opt.pieces())) {
    std::vector<at::Tensor> parts;
    for (std::size_t j = first; j < end; ++j) parts.push_back(opt.stateVector(j, k));
    out.push_back({opt.pieces()[first].packed * element_bytes, at::cat(parts).to(at::kCPU).contiguous()});
  }
  return out;
}

/// Streams [0, bytes) of the packed vector whose parts `held` this rank holds
/// (Note [sharded checkpoint]).
void streamVector(collective::Communicator& comm, const std::vector<HeldBytes>& held,
                  int64_t bytes, int64_t chunk,
                  const std::function<void(const char*, std::size_t)>& sink) {
  for (int64_t b0 = 0; b0 < bytes; b0 += chunk) {
    const int64_t len = std::min(chunk, bytes - b0);
    auto buf = at::zeros({(len + 7) / 8}, at::TensorOptions().dtype(at::kLong));
    for (const auto& h : held) {
      const int64_t end = h.begin + static_cast<int64_t>(h.values.nbytes());
      const int64_t a = std::max(b0, h.begin), b = std::min(b0 + len, end);
      if (a >= b) continue;
      std::memcpy(static_cast<char*>(buf.data_ptr()) + (a - b0),
                  static_cast<const char*>(h.values.data_ptr()) + (a - h.begin),
                  static_cast<std::size_t>(b - a));
    }
    auto on_device = buf.to(comm.device());
    comm.allreduce(on_device, collective::ReduceOp::kSum);
    if (comm.rank() == 0) {
      const auto host = on_device.to(at::kCPU).contiguous();
      sink(static_cast<const char*>(host.data_ptr()), static_cast<std::size_t>(len));
    }
  }
}

FlatHeader readHeader(std::ifstream& in, const std::string& file, std::vector<int64_t>* steps) {
  int64_t words[kHeaderWords] = {};
  in.read(reinterpret_cast<char*>(words), sizeof words);
  FlatHeader h;
  h.vectors = words[1];
  h.params = words[2];
  h.elements = words[3];
  h.element_bytes = words[4];
  h.dtype = words[5];
  if (!in || std::memcmp(words, kMagic, sizeof kMagic) != 0 || h.vectors < 0 || h.params < 0 ||
      h.elements < 0 || h.element_bytes <= 0 || h.params > (int64_t{1} << 32)) {
    throw Error(strCat(file, ": not a sharded optimizer state (bad header); the checkpoint is "
                       "damaged: resume from an older one or start fresh"));
  }
  steps->resize(static_cast<std::size_t>(h.params));
  in.read(reinterpret_cast<char*>(steps->data()), static_cast<std::streamsize>(h.params * 8));
  if (!in) throw Error(strCat(file, ": truncated step counts"));
  return h;
}

/// `n` elements of vector k from element `first`, as a CPU tensor of the file's dtype.
at::Tensor readElements(std::ifstream& in, const std::string& file, const FlatHeader& h,
                        int64_t k, int64_t first, int64_t n) {
  auto t = at::empty({n}, at::TensorOptions().dtype(static_cast<at::ScalarType>(h.dtype)));
  in.seekg(h.dataOffset() + k * h.vectorBytes() + first * h.element_bytes);
  in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(n * h.element_bytes));
  if (!in) throw Error(strCat(file, ": truncated (vector ", k, ", elements ", first, "+", n, ")"));
  return t;
}

/// This rank's parts of every vector into its pieces (Note [sharded checkpoint]):
/// one read per run of pieces consecutive in the packed space.
void readSlice(std::ifstream& in, const std::string& file, const FlatHeader& h,
               const std::vector<int64_t>& steps, Optimizer& opt,
               const std::vector<ShardPiece>& pieces) {
  for (const auto& [first, end] : packedRuns(pieces)) {
    const int64_t begin = pieces[first].packed;
    const int64_t stop = pieces[end - 1].packed + pieces[end - 1].length;
    for (int64_t k = 0; k < h.vectors; ++k) {
      const auto slot = readElements(in, file, h, k, begin, stop - begin);
      for (std::size_t j = first; j < end; ++j) {
        opt.setStateVector(j, static_cast<std::size_t>(k),
                           slot.narrow(0, pieces[j].packed - begin, pieces[j].length));
      }
    }
  }
  for (std::size_t j = 0; j < pieces.size(); ++j) {
    opt.setStepCount(j, steps[static_cast<std::size_t>(pieces[j].param)]);
  }
}

/// Every parameter's range of every vector into a whole optimizer.
void readWhole(std::ifstream& in, const std::string& file, const FlatHeader& h,
               const std::vector<int64_t>& steps, Optimizer& opt,
               const std::vector<at::Tensor>& params) {
  for (int64_t k = 0; k < h.vectors; ++k) {
    int64_t start = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      opt.setStateVector(i, static_cast<std::size_t>(k),
                         readElements(in, file, h, k, start, params[i].numel()));
      start += params[i].numel();
    }
  }
  for (std::size_t i = 0; i < params.size(); ++i) opt.setStepCount(i, steps[i]);
}

}  // namespace

FlatStateEntry gatherShardedState(ShardedOptimizer& opt, collective::Communicator& comm,
                                  std::size_t chunk_bytes,
                                  const std::function<void(const char*, std::size_t)>& sink) {
  const auto& l = opt.layout();
  const auto names = opt.stateNames();
  const auto& params = opt.params();
  FlatHeader h;
  h.vectors = static_cast<int64_t>(names.size());
  h.params = static_cast<int64_t>(params.size());
  h.elements = l.total;
  h.element_bytes = static_cast<int64_t>(params.front().element_size());
  h.dtype = static_cast<int64_t>(params.front().scalar_type());
  std::vector<double> steps(params.size(), 0.0);
  for (std::size_t j = 0; j < opt.pieces().size(); ++j) {
    auto& s = steps[static_cast<std::size_t>(opt.pieces()[j].param)];
    s = std::max(s, static_cast<double>(opt.stepCount(j)));
  }
  steps = comm.allreduce(steps, collective::ReduceOp::kMax);
  if (comm.rank() == 0) {
    int64_t words[kHeaderWords] = {0, h.vectors, h.params, h.elements, h.element_bytes, h.dtype, 0, 0};
    std::memcpy(words, kMagic, sizeof kMagic);
    sink(reinterpret_cast<const char*>(words), sizeof words);
    std::vector<int64_t> counts(steps.begin(), steps.end());
    sink(reinterpret_cast<const char*>(counts.data()), counts.size() * 8);
  }
  const int64_t chunk = std::max<int64_t>(8, static_cast<int64_t>(chunk_bytes) / 8 * 8);
  for (std::size_t k = 0; k < names.size(); ++k) {
    streamVector(comm, heldOf(opt, k, h.element_bytes), h.vectorBytes(), chunk, sink);
  }
  FlatStateEntry e;
  e.names = names;
  e.params = h.params;
  e.elements = h.elements;
  e.dtype = c10::toString(static_cast<at::ScalarType>(h.dtype));
  e.element_bytes = h.element_bytes;
  e.ranks = comm.size();
  e.chunk_bytes = chunk;
  return e;
}

void restoreFlatState(const std::string& file, const FlatStateEntry& entry,
                      Optimizer& opt, const ShardedOptimizer* sharded,
                      const std::vector<at::Tensor>& params) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(strCat(file, ": cannot open"));
  std::vector<int64_t> steps;
  const FlatHeader h = readHeader(in, file, &steps);
  const auto names = opt.stateNames();
  int64_t total = 0;
  for (const auto& p : params) total += p.numel();
  const nlohmann::ordered_json saved(entry.names);
  if (saved != nlohmann::ordered_json(names) || h.vectors != static_cast<int64_t>(names.size()) ||
      h.params != static_cast<int64_t>(params.size()) || h.elements != total ||
      h.element_bytes != static_cast<int64_t>(params.front().element_size())) {
    throw Error(strCat(file, ": the checkpoint's optimizer state (", saved.dump(), " over ",
                       h.params, " parameters, ", h.elements, " elements) does not fit this "
                       "optimizer and model (", nlohmann::ordered_json(names).dump(), " over ",
                       params.size(), " parameters, ", total, " elements)"));
  }
  if (sharded) {
    readSlice(in, file, h, steps, opt, sharded->pieces());
  } else {
    readWhole(in, file, h, steps, opt, params);
  }
}

void restoreWholeIntoSharded(const std::string& bytes, ShardedOptimizer& opt,
                             const at::Device& device) {
  const auto whole = opt.makeWhole();
  whole->loadState(bytes, device);
  const auto names = opt.stateNames();
  for (std::size_t j = 0; j < opt.pieces().size(); ++j) {
    const auto& piece = opt.pieces()[j];
    const auto i = static_cast<std::size_t>(piece.param);
    for (std::size_t k = 0; k < names.size(); ++k) {
      opt.setStateVector(j, k, whole->stateVector(i, k).narrow(0, piece.offset, piece.length));
    }
    opt.setStepCount(j, whole->stepCount(i));
  }
}

}  // namespace batchdist::worker
