#include "worker/train/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <sstream>

#include "common/error.h"
#include "collective/torch_compat.h"
#include "worker/common/console.h"
#include "worker/common/files.h"
#include "worker/common/heartbeat.h"
#include "worker/common/util.h"
#include "worker/model/archive.h"
#include "worker/model/model.h"
#include "worker/model/optimizer.h"
#include "worker/model/precision.h"
#include "worker/train/sharded_checkpoint.h"
#include "worker/train/sharded_optimizer.h"

namespace batchdist::worker {
namespace fs = std::filesystem;

uint64_t fnv1a64(const void* data, std::size_t n, uint64_t hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    hash ^= p[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

std::string checkpointName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

namespace {

// Format 5: under dist.shard: optimizer, optimizer_state.bin and the manifest's
// "optimizer_state" instead of optimizer.pt (Note [sharded checkpoint]).
// Format 4: the adaptive record's throughput, segments, history and noise entries
// keyed (worker/train/adapt_record.h); formats 2 and 3's positional ones are still
// read. Format 3: the history's epochs as keyed objects with the task's metrics
// (Note [task]); format 2's positional [epoch, train_loss, eval_loss,
// eval_accuracy, samples_per_s, seconds] is still read. Format 2: rng.pt as
// generator records (Note [rng records]) and the manifest's "rng"; format 1 (a
// torch archive of CPU generators) is still read.
constexpr int kFormat = 5;
constexpr int kOldestFormat = 1;
constexpr std::uintmax_t kMaxCheckpointFile = std::uintmax_t{1} << 40;

std::string hex(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string hashOf(const std::string& bytes) { return hex(fnv1a64(bytes.data(), bytes.size())); }

[[noreturn]] void ioError(const std::string& path, const char* what, int err) {
  throw Error(strCat(path, ": cannot ", what, " (", std::strerror(err), ")"));
}

/// Writes `bytes` to a new file and fsyncs it (the caller renames the directory).
void writeSynced(const std::string& path, const std::string& bytes) {
  ScopedFd f;
  f.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd < 0) ioError(path, "create", errno);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(f.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ioError(path, "write", n < 0 ? errno : ENOSPC);
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(f.fd) != 0) ioError(path, "fsync", errno);
  if (::close(f.fd) != 0) {
    f.fd = -1;
    ioError(path, "close", errno);
  }
  f.fd = -1;
}

void fsyncDir(const std::string& dir) {
  ScopedFd f;
  f.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (f.fd < 0) ioError(dir, "open", errno);
  if (::fsync(f.fd) != 0) ioError(dir, "fsync", errno);
}

/// Fault injection for the tests (Note [fault plan]): kills this process
/// (SIGKILL, as kill -9 would) when the write of the checkpoint after `step`
/// reaches `point` and `fault` asks for it there.
void faultPoint(const CheckpointFault& fault, CheckpointKill point, int64_t step) {
  if (!fault.killsAt(point, step)) return;
  std::cerr << strCat("batchdist: BATCHDIST_FAULT_CHECKPOINT=", checkpointKillName(point),
                      ": killing rank 0\n")
            << std::flush;
  ::raise(SIGKILL);
}

/// Parameters "p<i>" and buffers "b<i>", in the model's fixed order (names in the manifest).
std::string modelBytes(const Model& model) {
  torch::serialize::OutputArchive archive;
  const auto params = model.namedParameters();
  const auto buffers = model.namedBuffers();
  for (std::size_t i = 0; i < params.size(); ++i) {
    archive.write(strCat("p", i), params[i].second.detach(), /*is_buffer=*/true);
  }
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    archive.write(strCat("b", i), buffers[i].second.detach(), /*is_buffer=*/true);
  }
  return archiveBytes(archive);
}

/// rank 0's rng.pt as it is written: a file streamed in pieces, fsynced at the
/// end, with its size and FNV-1a 64 for the manifest (Note [rng records]).
class StreamedFile {
 public:
  void open(const std::string& path) {
    path_ = path;
    f_.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f_.fd < 0) ioError(path, "create", errno);
  }
  void write(const char* data, std::size_t n) {
    hash_ = fnv1a64(data, n, hash_);
    bytes_ += n;
    std::size_t done = 0;
    while (done < n) {
      const ssize_t w = ::write(f_.fd, data + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) ioError(path_, "write", w < 0 ? errno : ENOSPC);
      done += static_cast<std::size_t>(w);
    }
  }
  void finish() {
    if (::fsync(f_.fd) != 0) ioError(path_, "fsync", errno);
    const int fd = f_.fd;
    f_.fd = -1;
    if (::close(fd) != 0) ioError(path_, "close", errno);
  }
  std::size_t bytes() const { return bytes_; }
  uint64_t hash() const { return hash_; }

 private:
  std::string path_;
  ScopedFd f_;
  std::size_t bytes_ = 0;
  uint64_t hash_ = fnv1a64(nullptr, 0);
};

constexpr char kStateFile[] = "optimizer_state.bin";  // Note [sharded checkpoint]

/// A streamed file's entry in the manifest's "files".
nlohmann::ordered_json fileEntry(const std::string& name, const StreamedFile& f) {
  return {{"name", name}, {"bytes", f.bytes()}, {"fnv1a64", hex(f.hash())}};
}

constexpr char kRngMagic[8] = {'b', 'd', 'r', 'n', 'g', '0', '0', '2'};
constexpr int64_t kRngHeaderBytes = 32;  // magic, ranks, CPU state bytes, CUDA state bytes

int64_t roundUp8(int64_t n) { return (n + 7) / 8 * 8; }

/// What rng.pt holds (Note [rng records]): W records of the same size.
struct RngLayout {
  int64_t ranks = 0;
  int64_t cpu_bytes = 0;   ///< the largest CPU generator state of any rank
  int64_t cuda_bytes = 0;  ///< the largest CUDA generator state, 0 when no rank is on a GPU
  int64_t chunk_ranks = 0;
  /// [int64 CPU length][int64 CUDA length][CPU state][CUDA state], 8-byte aligned.
  int64_t record() const { return 16 + roundUp8(cpu_bytes) + roundUp8(cuda_bytes); }
  nlohmann::ordered_json json() const {
    return {{"layout", "records"}, {"ranks", ranks}, {"cpu", cpu_bytes > 0},
            {"cuda", cuda_bytes > 0}, {"cpu_bytes", cpu_bytes}, {"cuda_bytes", cuda_bytes},
            {"record_bytes", record()}, {"chunk_ranks", chunk_ranks}};
  }
};

/// Every rank's CPU generator and, on a GPU, its device's CUDA generator (Note
/// [cuda rng]), streamed to `sink` on rank 0 in rank order: the header, then the
/// records, at most `chunk_bytes` of them at a time (Note [rng records]).
/// Collective: one small allreduce for the sizes, then one allreduce per chunk.
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
  std::vector<char> mine(static_cast<std::size_t>(record), 0);
  const int64_t lengths[2] = {cpu.numel(), cuda.numel()};
  std::memcpy(mine.data(), lengths, sizeof lengths);
  std::memcpy(mine.data() + 16, cpu.data_ptr(), cpu.numel());
  if (cuda.numel() > 0) std::memcpy(mine.data() + 16 + roundUp8(l.cpu_bytes), cuda.data_ptr(), cuda.numel());
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

nlohmann::ordered_json historyJson(const std::vector<EpochStats>& history) {
  auto out = nlohmann::ordered_json::array();
  for (const auto& h : history) {
    auto metrics = nlohmann::ordered_json::object();
    for (const auto& x : h.eval_metrics) metrics[x.name] = x.value;
    out.push_back({{"epoch", h.epoch},
                   {"train_loss", h.train_loss},
                   {"eval_loss", h.eval_loss},
                   {"eval", metrics},
                   {"samples_per_s", h.samples_per_s},
                   {"seconds", h.seconds},
                   {"noise_scale", h.noise_scale}});
  }
  return out;
}

/// The manifest's own checksum: FNV-1a 64 over its dump without the "checksum" key.
std::string manifestChecksum(nlohmann::ordered_json m) {
  m.erase("checksum");
  return hashOf(m.dump());
}

nlohmann::ordered_json namesOf(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  auto out = nlohmann::ordered_json::array();
  for (const auto& [name, t] : named) out.push_back(name);
  return out;
}

}  // namespace

Checkpointer::Checkpointer(const CheckpointConfig& cfg, std::string dir, CheckpointIdentity id,
                           collective::Communicator& comm, const FaultPlan* faults)
    : cfg_(cfg), dir_(std::move(dir)), id_(std::move(id)), comm_(comm),
      fault_(faults ? faults->checkpoint : CheckpointFault{}),
      last_write_(monotonicSeconds()) {}

Checkpointer::~Checkpointer() {
  if (writer_.joinable()) writer_.join();
}

bool Checkpointer::dueBySteps(int64_t global_step) const {
  return cfg_.every_steps > 0 && global_step % cfg_.every_steps == 0;
}

bool Checkpointer::dueByAuto(int64_t steps_done) const {
  return comm_.rank() == 0 && cfg_.every_steps_auto && steps_done + 1 - std::max<int64_t>(last_step_, 0) >= auto_every_;
}

void Checkpointer::noteStep(double seconds) {
  step_s_ = step_s_ > 0 ? 0.9 * step_s_ + 0.1 * seconds : seconds;
}

void Checkpointer::updateAutoInterval(double waited_s, Console& console) {
  if (!cfg_.every_steps_auto || step_s_ <= 0) return;
  const double k = std::ceil(waited_s / (kAutoShare * step_s_));
  const int64_t every = std::clamp<int64_t>(static_cast<int64_t>(k), 1, 1000000);
  if (every == auto_every_) return;
  auto_every_ = every;
  console.line(strCat("checkpoint: every_steps auto: the step waited ", formatFixed(waited_s, 3),
                      " s for a checkpoint, a step takes ", formatFixed(step_s_, 3), " s: every ",
                      every, " step(s) (at most ", kAutoShare * 100, " % of the time)"));
}

bool Checkpointer::dueByTime() const {
  return comm_.rank() == 0 && cfg_.every_minutes > 0 &&
         monotonicSeconds() - last_write_ >= cfg_.every_minutes * 60;
}

CheckpointRecord Checkpointer::save(const TrainState& state, const TrainPosition& pos,
                                    bool on_signal, Console& console) {
  const double t0 = monotonicSeconds();
  CheckpointRecord rec;
  rec.step = pos.global_step;
  rec.on_signal = on_signal;
  rec.path = (fs::path(dir_) / checkpointName(pos.global_step)).string();
  const bool root = comm_.rank() == 0;
  last_step_ = pos.global_step;
  if (root) settle(console);  // Note [background checkpoint]: one write in flight at most
  std::string error, tmp;
  StreamedFile rng_file;
  if (root) {
    try {
      tmp = makeTemporary(pos.global_step);
      rng_file.open((fs::path(tmp) / "rng.pt").string());
    } catch (const std::exception& e) {  // Error, or std::filesystem's
      error = e.what();
    }
  }
  // A write that failed stops writing, not the collectives.
  const auto into = [&error](StreamedFile& file) {
    return [&error, f = &file](const char* data, std::size_t n) {
      if (!error.empty()) return;
      try {
        f->write(data, n);
      } catch (const std::exception& e) {
        error = e.what();
      }
    };
  };
  // Collective: every rank's generators, streamed into rank 0's rng.pt (Note [rng records]).
  const RngLayout rng = gatherRng(comm_, state.device, rng_chunk_bytes_, into(rng_file));
  // Collective: a sharded optimizer's state, streamed alike (Note [sharded checkpoint]).
  nlohmann::ordered_json opt_state;
  StreamedFile state_file;
  if (auto* sharded = dynamic_cast<ShardedOptimizer*>(state.optimizer)) {
    if (root && error.empty()) {
      try {
        state_file.open((fs::path(tmp) / kStateFile).string());
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    opt_state = gatherShardedState(*sharded, comm_, state_chunk_bytes_, into(state_file));
  }
  Prepared prepared;
  if (root && error.empty()) {
    try {
      rng_file.finish();
      auto written = nlohmann::ordered_json::array({fileEntry("rng.pt", rng_file)});
      if (!opt_state.is_null()) {
        state_file.finish();
        written.push_back(fileEntry(kStateFile, state_file));
        opt_state["file"] = kStateFile;
      }
      prepared = prepare(tmp, state, pos, rng.json(), written, opt_state, rec.path);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (root && !error.empty() && !tmp.empty()) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // a full disk gets its space back for the next try
  }
  last_write_ = monotonicSeconds();
  // Note [background checkpoint]: every rank takes the same branch (the stop
  // wish was agreed; the config is the same).
  if (cfg_.background && !on_signal) {
    rec.background = true;
    rec.seconds = monotonicSeconds() - t0;  // what the step waited
    if (!root) return rec;
    updateAutoInterval(rec.seconds, console);
    if (!error.empty()) {
      rec.error = error;
      report(rec, console);
      finished_[rec.step] = rec;
      return rec;
    }
    in_flight_ = rec;
    writer_done_ = false;
    writer_ = std::thread([this, p = std::move(prepared)] {
      const double w0 = monotonicSeconds();
      try {
        in_flight_.bytes = commit(p);
        heartbeat::setCheckpoint(p.step);  // Note [heartbeat]: durable now
      } catch (const std::exception& e) {
        in_flight_.error = e.what();
      }
      in_flight_.write_seconds = monotonicSeconds() - w0;
      writer_done_ = true;
    });
    return rec;
  }
  if (root && error.empty()) {
    const double w0 = monotonicSeconds();
    try {
      rec.bytes = commit(prepared);
    } catch (const std::exception& e) {
      error = e.what();
    }
    rec.write_seconds = monotonicSeconds() - w0;
  }
  rec.error = comm_.broadcast(error, 0);  // every rank learns the outcome
  rec.seconds = monotonicSeconds() - t0;
  last_write_ = monotonicSeconds();
  if (!root) return rec;
  if (rec.error.empty()) heartbeat::setCheckpoint(rec.step);  // Note [heartbeat]
  if (!on_signal) updateAutoInterval(rec.seconds, console);
  report(rec, console);
  return rec;
}

void Checkpointer::report(const CheckpointRecord& rec, Console& console) const {
  if (rec.error.empty()) {
    console.line(strCat("checkpoint: step ", rec.step, rec.on_signal ? " (stop signal)" : "", " -> ",
                        rec.path, " (", byteSize(rec.bytes), ", ",
                        rec.background ? strCat("the step waited ", formatFixed(rec.seconds, 2),
                                                " s, written in ", formatFixed(rec.write_seconds, 2),
                                                " s while training went on")
                                       : strCat(formatFixed(rec.seconds, 2), " s"),
                        ")"));
    try {
      prune(rec.step, console);
    } catch (const std::exception& e) {
      std::cerr << strCat("batchdist: warning: checkpoint retention in ", dir_, ": ", e.what(),
                          "\n");
    }
    return;
  }
  std::cerr << strCat("batchdist: error: checkpoint at step ", rec.step, " was not written: ",
                      rec.error,
                      rec.on_signal ? "; the run stops without it"
                                    : "; training goes on and tries again at the next interval",
                      ". Earlier checkpoints in ", dir_, " are untouched\n")
            << std::flush;
}

void Checkpointer::poll(Console& console) {
  if (writer_.joinable() && writer_done_.load()) settle(console);
}

void Checkpointer::settle(Console& console, std::vector<CheckpointRecord>* records) {
  if (writer_.joinable()) {
    writer_.join();
    report(in_flight_, console);
    finished_[in_flight_.step] = in_flight_;
  }
  if (records == nullptr) return;
  for (auto& r : *records) {
    const auto it = finished_.find(r.step);
    if (!r.background || it == finished_.end()) continue;
    r.error = it->second.error;
    r.bytes = it->second.bytes;
    r.write_seconds = it->second.write_seconds;
  }
}

std::string Checkpointer::makeTemporary(int64_t step) const {
  fs::create_directories(dir_);
  const std::string tmp =
      (fs::path(dir_) / strCat(".tmp-", checkpointName(step), "-", ::getpid())).string();
  fs::remove_all(tmp);
  if (::mkdir(tmp.c_str(), 0755) != 0) ioError(tmp, "create the directory", errno);
  return tmp;
}

Checkpointer::Prepared Checkpointer::prepare(const std::string& tmp, const TrainState& state,
                                             const TrainPosition& pos,
                                             const nlohmann::ordered_json& rng,
                                             const nlohmann::ordered_json& written,
                                             const nlohmann::ordered_json& opt_state,
                                             const std::string& final_path) const {
  Prepared out;
  out.step = pos.global_step;
  out.tmp = tmp;
  out.final_path = final_path;
  out.written = written;
  auto& files = out.files;
  files.emplace_back("model.pt", modelBytes(*state.model));
  // Note [sharded checkpoint]: a sharded state is in optimizer_state.bin already.
  if (opt_state.is_null()) files.emplace_back("optimizer.pt", state.optimizer->saveState());
  const Plan& p = id_.plan;
  // An adaptive run's plan is plan0 (Note [adaptive checkpoint]): its epoch, place
  // in the epoch and next lr are the adapt record's.
  const auto& a = pos.adapt;
  const int64_t spe = p.steps_per_epoch;
  nlohmann::ordered_json m{
      {"format", kFormat},
      {"batchdist_version", BATCHDIST_VERSION},
      {"torch_version", compat::torchVersion()},
      {"created_unix", static_cast<int64_t>(std::time(nullptr))},
      {"step", pos.global_step},
      {"epoch", !a.is_null() ? a.at("epoch").get<int64_t>() : spe > 0 ? pos.global_step / spe : 0},
      {"step_in_epoch",
       !a.is_null() ? a.at("step_in_epoch").get<int64_t>() : spe > 0 ? pos.global_step % spe : 0},
      {"lr_next", a.is_null() ? p.lrAt(pos.global_step) : a.at("lr_next").get<double>()},
      {"samples", pos.samples},
      {"epoch_samples", pos.epoch_samples},
      {"epoch_loss_sum", pos.epoch_loss_sum},
      {"history", historyJson(pos.history)},
      {"plan",
       {{"global", p.global}, {"per_gpu", p.per_gpu}, {"accum", p.accum},
        {"world_size", p.world_size}, {"steps_per_epoch", p.steps_per_epoch},
        {"total_steps", p.total_steps}, {"dataset_size", p.dataset_size}}},
      {"searched_per_gpu", id_.searched_per_gpu},
      {"levers", leversJson(id_.levers)},
      {"config_hash", hashOf(id_.config.dump())},
      {"config", id_.config},
      {"parameters", namesOf(state.model->namedParameters())},
      {"buffers", namesOf(state.model->namedBuffers())},
      {"rng", rng}};
  if (!pos.adapt.is_null()) m["adapt"] = pos.adapt;
  if (!opt_state.is_null()) m["optimizer_state"] = opt_state;
  if (state.scaler) {
    m["loss_scaler"] = {{"scale", state.scaler->scale()},
                        {"tracker", state.scaler->growthTracker()},
                        {"skipped", state.scaler->skippedSteps()}};
  }
  out.manifest = std::move(m);
  return out;
}

int64_t Checkpointer::commit(const Prepared& p) const {
  try {
    return commitFiles(p);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(p.tmp, ec);  // a full disk gets its space back for the next try
    throw;
  }
}

int64_t Checkpointer::commitFiles(const Prepared& p) const {
  const std::string& tmp = p.tmp;
  const std::string& final_path = p.final_path;
  const std::string name = checkpointName(p.step);
  auto m = p.manifest;
  int64_t bytes = 0;
  auto list = p.written;  // rng.pt (Note [rng records]), optimizer_state.bin
  for (const auto& f : p.written) bytes += f["bytes"].get<int64_t>();
  for (const auto& [file, data] : p.files) {
    writeSynced((fs::path(tmp) / file).string(), data);
    list.push_back({{"name", file}, {"bytes", data.size()}, {"fnv1a64", hashOf(data)}});
    bytes += static_cast<int64_t>(data.size());
  }
  faultPoint(fault_, CheckpointKill::kAfterFiles, p.step);
  m["files"] = list;
  m["checksum"] = manifestChecksum(m);
  const std::string manifest = m.dump(1) + "\n";
  writeSynced((fs::path(tmp) / "manifest.json").string(), manifest);  // last: it names the rest
  fsyncDir(tmp);
  // A directory of the same name (an abandoned timeline, or a damaged copy) is
  // moved aside first: rename(2) does not replace a non-empty directory.
  const std::string aside = tmp + ".old";
  if (fs::exists(final_path)) fs::rename(final_path, aside);
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) ioError(final_path, "rename into place", errno);
  fsyncDir(dir_);
  faultPoint(fault_, CheckpointKill::kAfterRename, p.step);
  fs::remove_all(aside);
  writeFileAtomic((fs::path(dir_) / "latest").string(), name + "\n");
  return bytes + static_cast<int64_t>(manifest.size());
}

namespace {

/// step-* directories under `dir`, newest first (by step).
std::vector<std::pair<int64_t, fs::path>> listCheckpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string n = entry.path().filename().string();
    if (n.rfind("step-", 0) != 0 || n.size() <= 5) continue;
    if (n.find_first_not_of("0123456789", 5) != std::string::npos) continue;
    out.emplace_back(std::stoll(n.substr(5)), entry.path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace

void Checkpointer::prune(int64_t written_step, Console& console) const {
  int64_t kept = 0;
  for (const auto& [step, path] : listCheckpoints(dir_)) {
    if (step > written_step) {
      console.line(strCat("checkpoint: removing ", path.string(),
                          " (newer than this run's step ", written_step,
                          ": left behind by a resume from an older checkpoint)"));
      fs::remove_all(path);
    } else if (++kept > cfg_.keep) {
      fs::remove_all(path);
    }
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string n = entry.path().filename().string();
    // Temporaries of writes that died (kill -9, full disk), not this process's.
    if (n.rfind(".tmp-", 0) == 0) fs::remove_all(entry.path(), ec);
  }
}

CheckpointCheck verifyCheckpoint(const std::string& path) {
  CheckpointCheck c;
  c.path = path;
  const auto manifest_path = (fs::path(path) / "manifest.json").string();
  std::error_code ec;
  if (!fs::exists(manifest_path, ec)) {
    c.problem = "no manifest.json (an incomplete write?)";
    return c;
  }
  std::string text;
  try {  // Note [input files are regular files]: a FIFO here waited in open()
    text = readFileBounded(manifest_path, 64 << 20, "manifest");
  } catch (const Error& e) {
    c.problem = e.what();
    return c;
  }
  try {
    c.manifest = nlohmann::ordered_json::parse(text);
  } catch (const std::exception& e) {
    c.problem = strCat("manifest.json is not valid JSON (", e.what(), ")");
    return c;
  }
  const auto& m = c.manifest;
  if (!m.is_object() || !m.contains("checksum") || m["checksum"] != manifestChecksum(m)) {
    c.problem = "manifest.json fails its checksum (damaged)";
    return c;
  }
  if (m.value("format", 0) < kOldestFormat || m.value("format", 0) > kFormat) {
    c.problem = strCat("format ", m.value("format", 0), ", this batchdist reads formats ",
                       kOldestFormat, " to ", kFormat);
    return c;
  }
  for (const auto& f : m["files"]) {
    const std::string name = f["name"];
    const auto file = (fs::path(path) / name).string();
    const InputFile in = openInputFile(file);  // Note [input files are regular files]
    if (in.fd < 0) {
      c.problem = strCat(name, ": ", in.error == ENOENT ? std::string("missing") : in.why());
      return c;
    }
    if (in.size != f["bytes"].get<std::uintmax_t>()) {
      c.problem = strCat(name, ": ", in.size, " bytes, the manifest says ",
                         f["bytes"].get<std::uintmax_t>(), " (truncated?)");
      return c;
    }
    if (hashOf(readFileBounded(file, kMaxCheckpointFile, "checkpoint file")) != f["fnv1a64"]) {
      c.problem = strCat(name, ": checksum mismatch (the file was damaged after it was written)");
      return c;
    }
  }
  return c;
}

std::optional<CheckpointCheck> findLatestCheckpoint(const std::string& dir,
                                                    std::vector<std::string>* rejected) {
  for (const auto& [step, path] : listCheckpoints(dir)) {
    auto c = verifyCheckpoint(path.string());
    if (c.problem.empty()) return c;
    if (rejected) rejected->push_back(strCat(path.string(), ": ", c.problem));
  }
  return std::nullopt;
}

TrainPosition positionOf(const nlohmann::ordered_json& m) {
  TrainPosition p;
  p.global_step = m["step"].get<int64_t>();
  p.samples = m["samples"].get<int64_t>();
  p.epoch_samples = m["epoch_samples"].get<int64_t>();
  p.epoch_loss_sum = m["epoch_loss_sum"].get<double>();
  if (m.contains("adapt")) p.adapt = m["adapt"];
  for (const auto& h : m["history"]) {
    EpochStats e;
    if (h.is_array()) {  // formats 1 and 2: positional, classification's accuracy
      e.epoch = h[0].get<int64_t>();
      e.train_loss = h[1].get<double>();
      e.eval_loss = h[2].get<double>();
      e.eval_metrics = {{"accuracy", h[3].get<double>()}};
      e.samples_per_s = h[4].get<double>();
      e.seconds = h[5].get<double>();
    } else {
      e.epoch = h.at("epoch").get<int64_t>();
      e.train_loss = h.at("train_loss").get<double>();
      e.eval_loss = h.at("eval_loss").get<double>();
      for (const auto& [name, v] : h.at("eval").items()) e.eval_metrics.push_back({name, v.get<double>()});
      e.samples_per_s = h.at("samples_per_s").get<double>();
      e.seconds = h.at("seconds").get<double>();
      e.noise_scale = h.value("noise_scale", -1.0);
    }
    p.history.push_back(e);
  }
  return p;
}

namespace {

void loadArchiveFile(torch::serialize::InputArchive& archive, const std::string& file,
                     const at::Device& device) {
  loadArchiveBytes(archive, readFileBounded(file, kMaxCheckpointFile, "checkpoint file"), device);
}

/// Copies the saved tensors into the model's own, in place (shapes checked).
void restoreModel(const std::string& dir, const nlohmann::ordered_json& m, Model& model,
                  const at::Device& device) {
  torch::serialize::InputArchive archive;
  loadArchiveFile(archive, (fs::path(dir) / "model.pt").string(), device);
  torch::NoGradGuard no_grad;
  const auto restore = [&](const char* prefix, const auto& named, const char* what) {
    if (m[what].size() != named.size()) {
      throw Error(strCat(dir, ": the checkpoint has ", m[what].size(), " ", what,
                         ", this model ", named.size()));
    }
    for (std::size_t i = 0; i < named.size(); ++i) {
      torch::Tensor t;
      archive.read(strCat(prefix, i), t, /*is_buffer=*/true);
      if (!t.sizes().equals(named[i].second.sizes())) {
        throw Error(strCat(dir, ": ", named[i].first, " has shape ", shapeText(t.sizes().vec()),
                           " in the checkpoint, ", shapeText(named[i].second.sizes().vec()),
                           " in this model"));
      }
      named[i].second.copy_(t);
    }
  };
  restore("p", model.namedParameters(), "parameters");
  restore("b", model.namedBuffers(), "buffers");
}

/// Format 1's rng.pt (before Note [rng records]): a torch archive of every rank's
/// CPU generator, "r<rank>"; read whole.
void restoreRngArchive(const std::string& dir, int rank) {
  torch::serialize::InputArchive archive;
  loadArchiveFile(archive, (fs::path(dir) / "rng.pt").string(), at::kCPU);
  torch::Tensor t;
  archive.read(strCat("r", rank), t, /*is_buffer=*/true);
  compat::setCpuRngState(t.to(torch::kByte));
}

/// This rank's record of rng.pt (Note [rng records]): the header and one record
/// are read, whatever W is. The CUDA state is restored on a GPU when present.
void restoreRngRecord(const std::string& dir, const nlohmann::ordered_json& layout, int rank,
                      const at::Device& device) {
  const std::string path = (fs::path(dir) / "rng.pt").string();
  std::ifstream in(path, std::ios::binary);
  int64_t header[4] = {};
  in.read(reinterpret_cast<char*>(header), sizeof header);
  RngLayout l;
  l.ranks = header[1];
  l.cpu_bytes = header[2];
  l.cuda_bytes = header[3];
  if (!in || std::memcmp(header, kRngMagic, sizeof kRngMagic) != 0 ||
      l.ranks != layout.value("ranks", int64_t{-1}) || l.cpu_bytes < 0 || l.cuda_bytes < 0 ||
      l.record() != layout.value("record_bytes", int64_t{-1}) || rank >= l.ranks) {
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

namespace {

/// The optimizer's state from optimizer.pt (an unsharded run's) or
/// optimizer_state.bin (a sharded run's), into a sharded or a whole optimizer
/// (Note [sharded checkpoint]).
void restoreOptimizer(const CheckpointCheck& ckpt, const TrainState& state) {
  auto* sharded = dynamic_cast<ShardedOptimizer*>(state.optimizer);
  const auto& m = ckpt.manifest;
  if (m.contains("optimizer_state")) {
    restoreFlatState((fs::path(ckpt.path) / kStateFile).string(), m["optimizer_state"],
                     *state.optimizer, sharded, state.model->trainableParameters());
    return;
  }
  const auto bytes = readFileBounded((fs::path(ckpt.path) / "optimizer.pt").string(),
                                     kMaxCheckpointFile, "checkpoint file");
  if (sharded) {
    restoreWholeIntoSharded(bytes, *sharded, state.device);
  } else {
    state.optimizer->loadState(bytes, state.device);
  }
}

}  // namespace

void restoreState(const CheckpointCheck& ckpt, const TrainState& state, int rank, int world) {
  const auto& m = ckpt.manifest;
  restoreModel(ckpt.path, m, *state.model, state.device);
  restoreOptimizer(ckpt, state);
  if (state.scaler && m.contains("loss_scaler")) {
    const auto& s = m["loss_scaler"];
    state.scaler->restore(s["scale"].get<double>(), s["tracker"].get<int64_t>(),
                          s["skipped"].get<int64_t>());
  }
  // Note [checkpoint]: rank r's generators belong to rank r of the same world size.
  if (m["plan"]["world_size"] != world) return;
  if (m.contains("rng") && m["rng"].value("layout", "") == "records") {
    restoreRngRecord(ckpt.path, m["rng"], rank, state.device);
  } else {
    restoreRngArchive(ckpt.path, rank);
  }
}

void checkResumable(const nlohmann::ordered_json& m, const Config& cfg, const std::string& path) {
  const auto& then = m["config"];
  // Loader threads and staging change how batches are made, not which.
  // model.recompute changes neither the weights nor the arithmetic (Note [activation recompute]).
  const std::vector<std::string> free_keys = {"data.workers", "data.prefetch", "data.pin_memory",
                                              "model.recompute"};
  std::string diff;
  for (const char* section : {"model", "data", "optim"}) {
    for (const auto& [key, value] : cfg.resolved[section].items()) {
      const std::string full = strCat(section, ".", key);
      if (std::find(free_keys.begin(), free_keys.end(), full) != free_keys.end()) continue;
      const auto old = then.value(section, nlohmann::ordered_json::object()).value(key, nlohmann::ordered_json());
      if (old != value) diff += strCat(diff.empty() ? "" : "; ", full, " = ", value.dump(), " now, ", old.dump(), " in the checkpoint");
    }
  }
  for (const char* key : {"seed"}) {
    const auto now = cfg.resolved["train"][key], old = then["train"].value(key, nlohmann::ordered_json());
    if (now != old) diff += strCat(diff.empty() ? "" : "; ", "train.", key, " = ", now.dump(), " now, ", old.dump(), " in the checkpoint");
  }
  if (cfg.resolved["batch"]["last_batch"] != then["batch"].value("last_batch", nlohmann::ordered_json())) {
    diff += strCat(diff.empty() ? "" : "; ", "batch.last_batch differs from the checkpoint's");
  }
  if (m.contains("adapt") && cfg.batch.adapt == BatchAdapt::kOff) {
    diff += strCat(diff.empty() ? "" : "; ", "batch.adapt = off now, ",
                   then["batch"].value("adapt", std::string("goodput")),
                   " in the checkpoint (its global batch and progress are adaptive)");
  } else if (m.contains("adapt")) {
    // goodput <-> warmup may change (as adapt_every_steps may): both keep the same
    // record, progress and gain rule, only the next decisions differ.
    // A checkpoint from before the key was written under AdaScale.
    const auto old_gain = then["batch"].value("adapt_gain", std::string("adascale"));
    if (toString(cfg.batch.adapt_gain) != old_gain) {
      diff += strCat(diff.empty() ? "" : "; ", "batch.adapt_gain = ", toString(cfg.batch.adapt_gain),
                     " now, ", old_gain,
                     " in the checkpoint (its progress counts G0-equivalent steps by that rule)");
    }
  }
  const int64_t g = m["plan"]["global"];
  if (cfg.batch.global > 0 && cfg.batch.global != g) {
    diff += strCat(diff.empty() ? "" : "; ", "batch.global = ", cfg.batch.global,
                   cfg.batch.global_tokens > 0  // Note [global tokens]
                       ? strCat(" (batch.global_tokens ", cfg.batch.global_tokens, ")")
                       : std::string(),
                   " now, ", g, " in the checkpoint");
  }
  if (!diff.empty()) {
    throw ConfigError(strCat(cfg.source, ": cannot resume ", path, ": ", diff,
                          ". A resumed run must train the same model with the same optimizer on "
                          "the same data with the same global batch (world size, per-GPU batch "
                          "and accumulation may change); start fresh in another --output or "
                          "checkpoint.dir, or restore those keys"));
  }
}

}  // namespace batchdist::worker
