#include "worker/train/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>

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
#include "worker/train/checkpoint/rng_records.h"
#include "worker/train/checkpoint/sharded_checkpoint.h"
#include "worker/train/shard/sharded_optimizer.h"

namespace batchdist::worker {
namespace fs = std::filesystem;

std::string checkpointName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::vector<std::pair<int64_t, std::string>> listCheckpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string n = entry.path().filename().string();
    if (n.rfind("step-", 0) != 0 || n.size() <= 5) continue;
    if (n.find_first_not_of("0123456789", 5) != std::string::npos) continue;
    out.emplace_back(std::stoll(n.substr(5)), entry.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

namespace {

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

/// A streamed file's entry in the manifest's files.
ManifestFile fileEntry(const std::string& name, const StreamedFile& f) {
  return {name, f.bytes(), hashHex(f.hash())};
}

/// `f()`, a failure caught into `error` (a write that failed stops writing, not the
/// collectives).
template <typename F>
void guarded(std::string& error, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {  // Error, or std::filesystem's
    error = e.what();
  }
}

/// A sink into `file` while `error` is empty.
std::function<void(const char*, std::size_t)> into(StreamedFile& file, std::string& error) {
  return [&error, f = &file](const char* data, std::size_t n) {
    if (error.empty()) guarded(error, [&] { f->write(data, n); });
  };
}

std::vector<std::string> namesOf(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  std::vector<std::string> out;
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
  last_step_ = pos.global_step;
  if (comm_.rank() == 0) settle(console);  // Note [background checkpoint]: one write in flight at most
  std::string error;
  Prepared prepared = gather(state, pos, rec.path, error);
  last_write_ = monotonicSeconds();
  // Note [background checkpoint]: every rank takes the same branch (the stop
  // wish was agreed; the config is the same).
  if (cfg_.background && !on_signal) {
    return writeInBackground(std::move(rec), std::move(prepared), error, t0, console);
  }
  return writeInForeground(std::move(rec), prepared, std::move(error), t0, console);
}

Checkpointer::Prepared Checkpointer::gather(const TrainState& state, const TrainPosition& pos,
                                            const std::string& final_path, std::string& error) {
  const bool root = comm_.rank() == 0;
  const WholeParameters whole(*state.model);  // Note [parameter units]: model.pt is whole
  Prepared p;
  p.step = pos.global_step;
  p.final_path = final_path;
  StreamedFile rng_file, state_file;
  if (root) {
    guarded(error, [&] {
      p.tmp = makeTemporary(pos.global_step);
      rng_file.open((fs::path(p.tmp) / "rng.pt").string());
    });
  }
  // Collective: every rank's generators, streamed into rank 0's rng.pt (Note [rng records]).
  const RngLayout rng = gatherRng(comm_, state.device, rng_chunk_bytes_, into(rng_file, error));
  // Collective: a sharded optimizer's state, streamed alike (Note [sharded checkpoint]).
  std::optional<FlatStateEntry> opt_state;
  if (auto* sharded = dynamic_cast<ShardedOptimizer*>(state.optimizer)) {
    if (root && error.empty()) {
      guarded(error, [&] { state_file.open((fs::path(p.tmp) / kStateFile).string()); });
    }
    opt_state = gatherShardedState(*sharded, comm_, state_chunk_bytes_, into(state_file, error));
  }
  if (root && error.empty()) {
    guarded(error, [&] {
      rng_file.finish();
      p.manifest = manifestOf(state, pos);
      p.manifest.rng = rng;
      p.manifest.files.push_back(fileEntry("rng.pt", rng_file));
      if (opt_state) {
        state_file.finish();
        p.manifest.files.push_back(fileEntry(kStateFile, state_file));
        opt_state->file = kStateFile;
        p.manifest.optimizer_state = std::move(opt_state);
      }
      prepare(state, p);
    });
  }
  if (root && !error.empty() && !p.tmp.empty()) {
    std::error_code ec;
    fs::remove_all(p.tmp, ec);  // a full disk gets its space back for the next try
  }
  return p;
}

CheckpointRecord Checkpointer::writeInBackground(CheckpointRecord rec, Prepared p,
                                                 const std::string& error, double t0,
                                                 Console& console) {
  rec.background = true;
  rec.seconds = monotonicSeconds() - t0;  // what the step waited
  if (comm_.rank() != 0) return rec;
  updateAutoInterval(rec.seconds, console);
  if (!error.empty()) {
    rec.error = error;
    report(rec, console);
    finished_[rec.step] = rec;
    return rec;
  }
  in_flight_ = rec;
  writer_done_ = false;
  writer_ = std::thread([this, p = std::move(p)] {
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

CheckpointRecord Checkpointer::writeInForeground(CheckpointRecord rec, const Prepared& p,
                                                 std::string error, double t0,
                                                 Console& console) {
  const bool root = comm_.rank() == 0;
  if (root && error.empty()) {
    const double w0 = monotonicSeconds();
    guarded(error, [&] { rec.bytes = commit(p); });
    rec.write_seconds = monotonicSeconds() - w0;
  }
  rec.error = comm_.broadcast(error, 0);  // every rank learns the outcome
  rec.seconds = monotonicSeconds() - t0;
  last_write_ = monotonicSeconds();
  if (!root) return rec;
  if (rec.error.empty()) heartbeat::setCheckpoint(rec.step);  // Note [heartbeat]
  if (!rec.on_signal) updateAutoInterval(rec.seconds, console);
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

CheckpointManifest Checkpointer::manifestOf(const TrainState& state,
                                            const TrainPosition& pos) const {
  const Plan& p = id_.plan;
  // An adaptive run's plan is plan0 (Note [adaptive checkpoint]): its epoch, place
  // in the epoch and next lr are the adapt record's.
  const auto& a = pos.adapt;
  const int64_t spe = p.steps_per_epoch;
  CheckpointManifest m;
  m.batchdist_version = BATCHDIST_VERSION;
  m.torch_version = compat::torchVersion();
  m.created_unix = static_cast<int64_t>(std::time(nullptr));
  m.step = pos.global_step;
  m.epoch = !a.is_null() ? a.at("epoch").get<int64_t>() : spe > 0 ? pos.global_step / spe : 0;
  m.step_in_epoch =
      !a.is_null() ? a.at("step_in_epoch").get<int64_t>() : spe > 0 ? pos.global_step % spe : 0;
  m.lr_next = a.is_null() ? p.lrAt(pos.global_step) : a.at("lr_next").get<double>();
  m.samples = pos.samples;
  m.epoch_samples = pos.epoch_samples;
  m.epoch_loss_sum = pos.epoch_loss_sum;
  m.history = pos.history;
  m.plan = manifestPlan(p);
  m.searched_per_gpu = id_.searched_per_gpu;
  m.levers = id_.levers;
  m.config_hash = fnv1a64Hex(id_.config.dump());
  m.config = id_.config;
  m.parameters = namesOf(state.model->namedParameters());
  m.buffers = namesOf(state.model->namedBuffers());
  m.adapt = pos.adapt;
  if (state.scaler) {
    m.loss_scaler = ScalerEntry{state.scaler->scale(), state.scaler->growthTracker(),
                                state.scaler->skippedSteps()};
  }
  return m;
}

void Checkpointer::prepare(const TrainState& state, Prepared& p) const {
  p.files.emplace_back("model.pt", modelBytes(*state.model));
  // Note [sharded checkpoint]: a sharded state is in optimizer_state.bin already.
  if (!p.manifest.optimizer_state) {
    p.files.emplace_back("optimizer.pt", state.optimizer->saveState());
  }
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
  auto m = p.manifest;  // its files: rng.pt (Note [rng records]), optimizer_state.bin
  int64_t bytes = 0;
  for (const auto& f : m.files) bytes += static_cast<int64_t>(f.bytes);
  for (const auto& [file, data] : p.files) {
    writeSynced((fs::path(tmp) / file).string(), data);
    m.files.push_back({file, data.size(), fnv1a64Hex(data)});
    bytes += static_cast<int64_t>(data.size());
  }
  faultPoint(fault_, CheckpointKill::kAfterFiles, p.step);
  const std::string manifest = manifestJson(m).dump(1) + "\n";
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

void Checkpointer::prune(int64_t written_step, Console& console) const {
  int64_t kept = 0;
  for (const auto& [step, path] : listCheckpoints(dir_)) {
    if (step > written_step) {
      console.line(strCat("checkpoint: removing ", path,
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

}  // namespace batchdist::worker
