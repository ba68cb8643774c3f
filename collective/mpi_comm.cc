#include "collective/mpi_comm.h"

#include <ATen/ATen.h>
#include <mpi.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdlib>
#include <thread>

#include "common/error.h"
#include "collective/flat_collectives.h"
#include "collective/process_group.h"

namespace batchdist::collective {
namespace {

MPI_Op toMpi(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
  }
  return MPI_SUM;
}

/// MPI's type for a dtype it can reduce natively; MPI_DATATYPE_NULL otherwise
/// (half, bfloat16: reduced in float).
MPI_Datatype toMpi(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kLong: return MPI_INT64_T;
    case at::kInt: return MPI_INT32_T;
    case at::kByte: return MPI_UINT8_T;
    case at::kChar: return MPI_INT8_T;
    default: return MPI_DATATYPE_NULL;
  }
}

/// An unsigned integer type as wide as one element of `t`: what an all-gather,
/// which does no arithmetic, moves any dtype as (half, bfloat16, bool included).
MPI_Datatype bitsOf(const at::Tensor& t) {
  switch (t.element_size()) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    case 8: return MPI_UINT64_T;
    default: return MPI_DATATYPE_NULL;
  }
}

/// One non-blocking MPI collective. `buffer` is what MPI reads and writes; when
/// it is a stand-in for the caller's tensor (another dtype, not contiguous),
/// wait() copies the result back into `target`. `send` (may be undefined): a
/// separate buffer MPI reads, kept alive until the collective completes.
class MpiWork : public PendingWork {
 public:
  MpiWork(MPI_Request request, at::Tensor buffer, at::Tensor target, at::Tensor send,
          WorkOrigin origin)
      : request_(request), buffer_(std::move(buffer)), target_(std::move(target)),
        send_(std::move(send)), origin_(std::move(origin)) {}

  ~MpiWork() override {
    // Never leave MPI writing into a freed buffer. A work dropped without wait()
    // (an exception between start and wait) is completed here, within the
    // timeout; one that cannot complete (a peer stopped, or wait() timed out) is
    // abandoned with its buffer leaked on purpose: the job is ending anyway, and
    // blocking here would hang it.
    if (request_ == MPI_REQUEST_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (!timed_out_) {
      const auto deadline = std::chrono::steady_clock::now() + origin_.timeout;
      for (int done = 0;;) {
        if (MPI_Test(&request_, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) return;
        if (std::chrono::steady_clock::now() > deadline) break;
        std::this_thread::yield();
      }
    }
    new at::Tensor(buffer_);  // leaked: MPI may still write into it
    if (send_.defined()) new at::Tensor(send_);  // ... or read from it
  }

  void progress() override {
    // Only from the thread that owns the communicator (MPI's thread level); an
    // error is kept for wait() to report.
    if (request_ == MPI_REQUEST_NULL || failed_ != MPI_SUCCESS ||
        std::this_thread::get_id() != owner_) {
      return;
    }
    int done = 0;
    failed_ = MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
    if (done) endTrace();
  }

  void wait() override {
    const auto started = std::chrono::steady_clock::now();
    const auto deadline = started + origin_.timeout;
    bool patient = false;
    for (int done = 0, spins = 0;; ++spins) {
      const int rc = failed_ != MPI_SUCCESS ? failed_ : MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        throw CollectiveError(strCat("mpi ", origin_.label(), " failed: ", mpiErrorText(rc)));
      }
      if (done) break;
      // Check the clock now and then; yield so a peer on the same core can run.
      // A collective that has waited over a second is waiting for a peer, not
      // for the wire: sleep briefly between tests (MPI progresses only inside
      // them), so that waiting ranks leave the cores to the ranks they wait for
      // (oversubscribed hosts, a stalled peer).
      if (patient) std::this_thread::sleep_for(std::chrono::microseconds(200));
      if ((spins & 1023) == 1023 || patient) {
        const auto now = std::chrono::steady_clock::now();
        patient = now - started > std::chrono::seconds(1);
        if (now > deadline) {
          timed_out_ = true;
          throw CollectiveError(strCat("mpi ", origin_.label(), " failed (timeout ",
                                       origin_.timeout.count() / 1000.0, " s, dist.timeout_s).",
                                       origin_.stall()));
        }
        std::this_thread::yield();
      }
    }
    endTrace();
    if (target_.defined()) target_.copy_(buffer_);
  }

 private:
  MPI_Request request_;
  std::thread::id owner_ = std::this_thread::get_id();  // made by the communicator's thread
  int failed_ = MPI_SUCCESS;  // progress() saw this error
  bool timed_out_ = false;
  at::Tensor buffer_;
  at::Tensor target_;
  at::Tensor send_;
  WorkOrigin origin_;
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(c10::intrusive_ptr<c10d::Store> store, at::Device device,
                  std::chrono::milliseconds timeout, MPI_Comm parent)
      : device_(device), timeout_(timeout), store_(std::move(store)),
        owner_(std::this_thread::get_id()) {
    // Our own communicator: nothing else that uses the parent (the rendezvous)
    // can match our messages.
    checkMpi(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup of the job's communicator");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }

  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backendName() const override { return "mpi"; }
  at::Device device() const override { return device_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  void allreduce(at::Tensor& t, ReduceOp op) override { allreduceAsync(t, op)->wait(); }

  std::unique_ptr<PendingWork> allreduceAsync(at::Tensor& t, ReduceOp op) override {
    check("allreduce", t);
    auto [buffer, target] = staged(t);
    MPI_Request req = MPI_REQUEST_NULL;
    const int rc = MPI_Iallreduce(MPI_IN_PLACE, buffer.data_ptr(), count(buffer),
                                  toMpi(buffer.scalar_type()), toMpi(op), comm_, &req);
    return started(rc, req, std::move(buffer), std::move(target), "allreduce");
  }

  void broadcast(at::Tensor& t, int root) override {
    check("broadcast", t);
    auto [buffer, target] = staged(t);
    MPI_Request req = MPI_REQUEST_NULL;
    const int rc = MPI_Ibcast(buffer.data_ptr(), count(buffer), toMpi(buffer.scalar_type()), root,
                              comm_, &req);
    started(rc, req, std::move(buffer), std::move(target), "broadcast")->wait();
  }

  at::Tensor allgather(const at::Tensor& t) override {
    auto in = t;
    check("allgather", in);
    auto [buffer, unused] = staged(in);
    (void)unused;
    std::vector<int64_t> shape{size_};
    for (auto d : buffer.sizes()) shape.push_back(d);
    auto out = at::empty(shape, buffer.options());
    MPI_Request req = MPI_REQUEST_NULL;
    const auto type = toMpi(buffer.scalar_type());
    const int rc = MPI_Iallgather(buffer.data_ptr(), count(buffer), type, out.data_ptr(),
                                  count(buffer), type, comm_, &req);
    started(rc, req, buffer, at::Tensor(), "allgather")->wait();
    return out.to(t.scalar_type());
  }

  std::unique_ptr<PendingWork> reduceScatterAsync(const at::Tensor& input, at::Tensor& output,
                                                  ReduceOp op) override {
    const auto shape =
        checkFlat(FlatCollective::kReduceScatter, input, output, rank_, size_, "mpi");
    check("reduceScatter", input);  // output: on the same device (checkFlat)
    if (shape.n == 0) return finishedWork();
    // MPI reduces half and bfloat16 in float, and may not write into what it
    // reads (in place): then it works on copies, and wait() writes `output`.
    const bool native = toMpi(input.scalar_type()) != MPI_DATATYPE_NULL;
    const bool direct = native && !shape.in_place;
    at::Tensor send = native ? input : input.to(at::kFloat);
    at::Tensor recv = direct ? output : at::empty({shape.n}, send.options());
    MPI_Request req = MPI_REQUEST_NULL;
    const int rc = MPI_Ireduce_scatter_block(send.data_ptr(), recv.data_ptr(), count(recv),
                                             toMpi(send.scalar_type()), toMpi(op), comm_, &req);
    return started(rc, req, std::move(recv), direct ? at::Tensor() : output, "reduceScatter",
                   std::move(send));
  }

  std::unique_ptr<PendingWork> allgatherIntoAsync(const at::Tensor& input,
                                                  at::Tensor& output) override {
    const auto shape =
        checkFlat(FlatCollective::kAllgatherInto, input, output, rank_, size_, "mpi");
    check("allgatherInto", input);  // output: on the same device (checkFlat)
    if (shape.n == 0) return finishedWork();
    const MPI_Datatype type = bitsOf(input);
    if (type == MPI_DATATYPE_NULL) {
      throw CollectiveError(strCat("mpi allgatherInto: ", input.scalar_type(), " (",
                                   input.element_size(), " bytes an element) has no MPI type"));
    }
    // In place, this rank's n elements are already in their slot of `output`.
    const void* send = shape.in_place ? MPI_IN_PLACE : input.data_ptr();
    MPI_Request req = MPI_REQUEST_NULL;
    const int rc = MPI_Iallgather(send, count(input), type, output.data_ptr(), count(input), type,
                                  comm_, &req);
    return started(rc, req, output, at::Tensor(), "allgatherInto", input);
  }

  bool nativeFlatCollectives() const override { return true; }

  void barrier() override {
    auto t = at::zeros({1}, at::kFloat);
    allreduce(t, ReduceOp::kSum);
  }

 private:
  void check(const char* what, const at::Tensor& t) const {
    if (std::this_thread::get_id() != owner_) {
      throw CollectiveError(strCat("mpi ", what, " called from another thread than the one that "
                                   "joined the group (MPI_THREAD_FUNNELED; Note [mpi backend])"));
    }
    if (!t.device().is_cpu()) {
      throw CollectiveError(strCat("mpi ", what, ": tensor on ", t.device().str(),
                                   "; dist.backend: mpi takes host tensors only"));
    }
  }

  static int count(const at::Tensor& t) {
    if (t.numel() > std::numeric_limits<int>::max()) {
      throw CollectiveError(strCat("mpi: a tensor of ", t.numel(),
                                   " elements is over MPI's int count; use smaller "
                                   "dist.bucket_mb"));
    }
    return static_cast<int>(t.numel());
  }

  /// What MPI works on: `t` itself when contiguous in a dtype MPI reduces, else a
  /// contiguous copy (float for half/bfloat16) and `t` as the target to copy back.
  static std::pair<at::Tensor, at::Tensor> staged(at::Tensor& t) {
    const bool native = toMpi(t.scalar_type()) != MPI_DATATYPE_NULL;
    if (native && t.is_contiguous()) return {t, at::Tensor()};
    auto buffer = t.to(native ? t.scalar_type() : at::kFloat).contiguous().clone();
    return {buffer, t};
  }

  std::unique_ptr<PendingWork> started(int rc, MPI_Request req, at::Tensor buffer,
                                       at::Tensor target, const char* what,
                                       at::Tensor send = at::Tensor()) {
    ++seq_;
    countCollectiveStart();
    if (rc != MPI_SUCCESS) {
      throw CollectiveError(strCat("mpi ", what, " #", seq_, " could not start: ", mpiErrorText(rc)));
    }
    return std::make_unique<MpiWork>(req, std::move(buffer), std::move(target), std::move(send),
                                     WorkOrigin{what, rank_, size_, timeout_, store_, seq_});
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  at::Device device_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;  // for the stall report only
  std::thread::id owner_;
  uint64_t seq_ = 0;  // collectives started (Note [stall report])
};

}  // namespace

void preferRingAllreduce() { setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", /*overwrite=*/0); }

std::string mpiErrorText(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return strCat("MPI error code ", code);
  return std::string(text, static_cast<std::size_t>(len));
}

void checkMpi(int rc, const std::string& call) {
  if (rc != MPI_SUCCESS) throw CollectiveError(strCat(call, " failed: ", mpiErrorText(rc)));
}

bool mpiAvailable() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

std::unique_ptr<Communicator> createMpiCommunicator(const c10::intrusive_ptr<c10d::Store>& store,
                                                    at::Device device,
                                                    std::chrono::milliseconds timeout,
                                                    MPI_Comm parent) {
  if (!mpiAvailable()) {
    throw ConfigError("dist.backend: 'mpi' needs the job started by mpirun (MPI is not "
                      "initialised in this process); use gloo or auto");
  }
  if (!device.is_cpu()) {
    throw ConfigError("dist.backend: 'mpi' takes host tensors only, but this rank trains on " +
                      device.str() + "; use nccl or auto on GPUs");
  }
  return std::make_unique<MpiCommunicator>(store, device, timeout, parent);
}

}  // namespace batchdist::collective
