#include "collective/process_group.h"

#include <ATen/ATen.h>

#include <unistd.h>

#include <algorithm>
#include <future>
#include <memory>
#include <thread>

#include "collective/error.h"
#include "collective/mpi_comm.h"
#include "collective/torch_compat.h"

namespace batchdist::collective {
namespace {

c10d::ReduceOp toC10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return c10d::ReduceOp::SUM;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
  }
  return c10d::ReduceOp::SUM;
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

/// The first line of `s`, without a trailing period or exclamation mark (the
/// caller ends the sentence).
std::string firstLine(const std::string& s) {
  std::string line = s.substr(0, s.find('\n'));
  while (!line.empty() && (line.back() == '.' || line.back() == '!' || line.back() == ' ')) {
    line.pop_back();
  }
  return line;
}

std::string thisHost() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

std::string text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

class C10dWork : public PendingWork {
 public:
  C10dWork(compat::WorkPtr work, std::string what, int rank, int size,
           std::chrono::milliseconds timeout, c10::intrusive_ptr<c10d::Store> store, uint64_t seq)
      : work_(std::move(work)), what_(std::move(what)), rank_(rank), size_(size),
        timeout_(timeout), store_(std::move(store)), seq_(seq) {}

  void wait() override {
    try {
      work_->wait(timeout_);
    } catch (const std::exception& e) {
      throw CollectiveError(strCat(what_, " #", seq_, " failed (timeout ",
                                   timeout_.count() / 1000.0, " s, dist.timeout_s): ",
                                   firstLine(e.what()), ".",
                                   stallReport(store_, rank_, size_, seq_)));
    }
  }

 private:
  compat::WorkPtr work_;
  std::string what_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  uint64_t seq_;
};

class ProcessGroupCommunicator : public Communicator {
 public:
  ProcessGroupCommunicator(compat::BackendPtr backend, std::string name, int rank, int size,
                           at::Device device, std::chrono::milliseconds timeout,
                           c10::intrusive_ptr<c10d::Store> store)
      : backend_(std::move(backend)), name_(std::move(name)), rank_(rank), size_(size),
        device_(device), timeout_(timeout), store_(std::move(store)) {}

  ~ProcessGroupCommunicator() override {
    try {
      compat::shutdownBackend(backend_);
    } catch (const std::exception&) {
      // Leaving anyway; the backend's destructor cleans up what is left.
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backendName() const override { return name_; }
  at::Device device() const override { return device_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  void allreduce(at::Tensor& t, ReduceOp op) override { allreduceAsync(t, op)->wait(); }

  std::unique_ptr<PendingWork> allreduceAsync(at::Tensor& t, ReduceOp op) override {
    std::vector<at::Tensor> ts{t};
    c10d::AllreduceOptions o;
    o.reduceOp = toC10d(op);
    o.timeout = timeout_;
    return wrap(call("allreduce", [&] { return backend_->allreduce(ts, o); }), "allreduce");
  }

  void broadcast(at::Tensor& t, int root) override {
    std::vector<at::Tensor> ts{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = timeout_;
    wrap(call("broadcast", [&] { return backend_->broadcast(ts, o); }), "broadcast")->wait();
  }

  at::Tensor allgather(const at::Tensor& t) override {
    auto in = t.contiguous();
    std::vector<at::Tensor> inputs{in};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < size_; ++r) outputs[0].push_back(at::empty_like(in));
    c10d::AllgatherOptions o;
    o.timeout = timeout_;
    wrap(call("allgather", [&] { return backend_->allgather(outputs, inputs, o); }), "allgather")
        ->wait();
    return at::stack(outputs[0]);
  }

  void barrier() override {
    // A tiny allreduce instead of c10d's barrier: same semantics, and NCCL's barrier
    // guesses a device from the rank, which is wrong across nodes.
    auto t = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device_));
    allreduce(t, ReduceOp::kSum);
  }

 private:
  template <typename F>
  compat::WorkPtr call(const char* what, F&& f) {
    try {
      return f();
    } catch (const std::exception& e) {
      throw CollectiveError(strCat(what, " could not start (", name_,
                                   "): ", firstLine(e.what())));
    }
  }

  std::unique_ptr<PendingWork> wrap(compat::WorkPtr w, const char* what) {
    return std::make_unique<C10dWork>(std::move(w), strCat(name_, " ", what), rank_, size_,
                                      timeout_, store_, ++seq_);
  }

  compat::BackendPtr backend_;
  std::string name_;
  int rank_;
  int size_;
  at::Device device_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;  // for the stall report only
  uint64_t seq_ = 0;                       // collectives started (Note [stall report])
};

}  // namespace

/// Note [stall report]: when a collective times out, the ranks that are still
/// alive find out who is missing, as c10d's monitored barrier and Horovod's
/// stall inspector do: each writes "arrived at collective #seq" to the
/// rendezvous store, waits a few seconds for the others' keys, and names the
/// ranks (and hosts) whose key never came: they are stopped (SIGSTOP, a debugger),
/// hung elsewhere, or dead. Every rank counts its collectives in the same order,
/// so #seq is the same collective on every rank. The store lives on rank 0: if
/// it does not answer, rank 0 itself is the one missing.
namespace {

constexpr char kStoreSilent[] =
    " The rendezvous store on rank 0 does not answer either: rank 0 is stopped, hung or dead.";

std::string stallReportNow(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                           uint64_t seq) {
  const std::string prefix = strCat("batchdist/stall/", seq, "/");
  try {
    store->setTimeout(std::chrono::seconds(5));
    store->set(prefix + std::to_string(rank), bytes(thisHost()));
    std::vector<int> missing;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (;;) {
      missing.clear();
      for (int r = 0; r < size; ++r) {
        if (!store->check({prefix + std::to_string(r)})) missing.push_back(r);
      }
      if (missing.empty() || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    if (missing.empty()) {
      return " Every rank reached this collective, so the network between them is the likely "
             "cause (or dist.timeout_s is too short for this step).";
    }
    std::string who;
    for (int r : missing) {
      std::string host = "?";
      try {
        if (store->check({strCat("batchdist/host/", r)})) host = text(store->get(strCat("batchdist/host/", r)));
      } catch (const std::exception&) {
      }
      who += strCat(who.empty() ? "" : ", ", "rank ", r, " (host ", host, ")");
    }
    return strCat(" Did not reach it: ", who,
                  "; stopped (SIGSTOP, a debugger), hung in something else, or dead.");
  } catch (const std::exception&) {
    return kStoreSilent;
  }
}

}  // namespace

std::string stallReport(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                        uint64_t seq) {
  if (!store) return "";
  // A store whose server is stopped (SIGSTOP on rank 0) keeps the connection open
  // and never answers; some store calls have no timeout of their own. So the
  // report runs on a thread of its own, and is given up after 15 s.
  auto done = std::make_shared<std::promise<std::string>>();
  auto answer = done->get_future();
  std::thread([=] { done->set_value(stallReportNow(store, rank, size, seq)); }).detach();
  if (answer.wait_for(std::chrono::seconds(15)) != std::future_status::ready) return kStoreSilent;
  return answer.get();
}

std::vector<std::string> availableBackends() {
#if defined(BATCHDIST_WITH_NCCL)
  return {"gloo", "mpi", "nccl"};
#else
  return {"gloo", "mpi"};
#endif
}

std::string resolveBackend(const std::string& requested, const at::Device& device,
                           bool one_host) {
  const auto have = availableBackends();
  const bool compiled = std::find(have.begin(), have.end(), requested) != have.end();
  if (requested == "auto") {
    if (device.is_cuda()) {
      return std::find(have.begin(), have.end(), "nccl") != have.end() ? "nccl" : "gloo";
    }
    // Note [mpi backend]: within one host, MPI's shared memory beats Gloo's TCP
    // loopback by far (README, Performance); across hosts Gloo stays the default.
    return one_host && mpiAvailable() ? "mpi" : "gloo";
  }
  if (requested != "gloo" && requested != "nccl" && requested != "mpi") {
    throw ConfigError(strCat("dist.backend: unknown backend '", requested,
                             "'; this build has: auto, ", joined(have)));
  }
  if (!compiled) {
    throw ConfigError(strCat("dist.backend: '", requested,
                             "' is not compiled into this build (Torch without CUDA); this "
                             "build has: auto, ",
                             joined(have)));
  }
  if (requested == "mpi" && !device.is_cpu()) {
    throw ConfigError(strCat("dist.backend: 'mpi' takes host tensors only, but this rank trains "
                             "on ", device.str(), "; use nccl or auto on GPUs"));
  }
  if (requested == "nccl" && !device.is_cuda()) {
    throw ConfigError(
        "dist.backend: 'nccl' needs a CUDA device, but this rank trains on the CPU "
        "(train.device); use gloo or auto");
  }
  return requested;
}

std::unique_ptr<Communicator> createCommunicator(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int size, const BackendOptions& opts) {
  const std::string name = resolveBackend(opts.backend, opts.device, opts.one_host);
  if (name == "mpi") {
    auto comm = createMpiCommunicator(store, opts.device, opts.timeout);
    try {
      store->set(strCat("batchdist/host/", rank), bytes(thisHost()));  // for the stall report
    } catch (const std::exception&) {
    }
    return comm;
  }
  compat::BackendPtr backend;
  try {
    if (name == "gloo") {
      auto device = opts.interface.empty()
                        ? c10d::ProcessGroupGloo::createDeviceForHostname(opts.address)
                        : c10d::ProcessGroupGloo::createDeviceForInterface(opts.interface);
      backend = compat::makeGloo(store, rank, size, opts.timeout, device);
    }
#if defined(BATCHDIST_WITH_NCCL)
    if (name == "nccl") backend = compat::makeNccl(store, rank, size, opts.timeout);
#endif
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw CollectiveError(strCat(
        "could not join the ", name, " process group of ", size, " ranks within ",
        opts.timeout.count() / 1000.0, " s: ", what.substr(0, what.find('\n')),
        ". Check that every rank can reach the others (dist.interface / BATCHDIST_IFNAME)"));
  }
  try {
    store->set(strCat("batchdist/host/", rank), bytes(thisHost()));  // for the stall report
  } catch (const std::exception&) {
  }
  return std::make_unique<ProcessGroupCommunicator>(std::move(backend), name, rank, size,
                                                    opts.device, opts.timeout, store);
}

}  // namespace batchdist::collective
