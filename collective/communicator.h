#pragma once
// batchdist::collective: the few collectives a data-parallel worker needs, over
// a c10d backend (Gloo on CPU, NCCL on CUDA). Every call is blocking unless it
// says otherwise, and every blocking call is bounded by the communicator's timeout.

#include <ATen/core/Tensor.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/trace.h"

namespace batchdist::collective {

enum class ReduceOp { kSum, kMin, kMax };

/// Per-step values summed over the ranks inside the gradient allreduce, at no
/// extra collective: a few tail elements of one bucket. The trainer gives each
/// per-step wish a slot that counts the ranks asking (Note [step wishes] in
/// worker/train/trainer.h): sums of counts up to W are exact in the fp32 bucket
/// for W < 2^24.
using SideChannel = std::array<double, 3>;

/// Collectives this process has started, over all its communicators (every
/// backend counts each one as it launches it). Thread-safe, for the heartbeat
/// (Note [heartbeat]): every rank starts the same collectives in the same order,
/// so a rank that hangs outside a collective falls behind the others' count.
uint64_t collectivesStarted();
/// Counts one collective started (the backends call it).
void countCollectiveStart();

/// An asynchronous collective in flight. wait() blocks until it completes or the
/// communicator's timeout expires (then it throws CollectiveError). On NCCL,
/// completion means "enqueued on the current CUDA stream", as in c10d.
class PendingWork {
 public:
  virtual ~PendingWork() = default;
  virtual void wait() = 0;
  /// Lets the collective advance without waiting for it. Backends with their own
  /// threads (Gloo, NCCL) need no help: a no-op. MPI moves a non-blocking
  /// collective only inside MPI calls made by this thread (Note [mpi backend]),
  /// so the reducer calls this from its autograd hooks.
  virtual void progress() {}
  /// Note [trace ranges]: a range named `name` in a profiler trace, from now
  /// until the collective completes: when the backend marks it done (Gloo's
  /// thread, MPI's test) or at the latest when wait() returns (NCCL: enqueued on
  /// the stream; the trace's kernel shows the device's time). Nothing when no
  /// profiler is on.
  virtual void trace(const std::string& name);

 protected:
  /// Ends the range of trace() (every wait() calls it once the work is done).
  void endTrace() {
    if (range_) range_->end();
  }
  std::shared_ptr<trace::AsyncRange> range_;
};

/// Note [trace ranges]: "batchdist/allreduce bucket 3 (6.2 MB)" ("(20 KB)" below
/// a MB), the name of a gradient bucket's collective `op` over `t`.
std::string bucketTraceName(const char* op, std::size_t index, const at::Tensor& t);

/// Collectives among `size()` ranks. All ranks must call the same collectives in
/// the same order with tensors of the same shape and dtype (as in MPI/c10d).
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "gloo", "mpi" or "nccl".
  virtual std::string backendName() const = 0;
  /// Device that tensors passed to this communicator live on.
  virtual at::Device device() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  /// In-place reduction of `t` over all ranks.
  virtual void allreduce(at::Tensor& t, ReduceOp op) = 0;
  /// Starts an in-place reduction; `t` must stay alive and untouched until wait().
  virtual std::unique_ptr<PendingWork> allreduceAsync(at::Tensor& t, ReduceOp op) = 0;
  /// Overwrites `t` on every rank with root's `t`.
  virtual void broadcast(at::Tensor& t, int root) = 0;
  /// Returns a tensor of shape [size(), t.sizes()...] holding every rank's `t`.
  virtual at::Tensor allgather(const at::Tensor& t) = 0;
  virtual void barrier() = 0;

  // Flat collectives over one buffer of W x n elements, W = size(), for state
  // sharded over the ranks (Note [flat collectives] in collective/flat_collectives.h).
  // Both tensors 1-D and contiguous, of one dtype, on device(); output may be input's
  // slot of this rank (reduceScatter) or input output's (allgatherInto), in place;
  // any other overlap, layout or size is refused with a CollectiveError naming what
  // was passed. Every rank passes the same n.

  /// Rank r's `output` (n elements) receives the reduction over the ranks of their
  /// `input` slices [r n, (r+1) n) (`input`: W x n elements). `input` is unchanged.
  void reduceScatter(const at::Tensor& input, at::Tensor& output, ReduceOp op);
  /// Starts a reduceScatter: `input` and `output` must stay alive, and `input`
  /// unchanged, until wait(); `output` holds the result after wait() (on NCCL:
  /// enqueued on the current stream), and only then: some paths write it inside
  /// wait() (Gloo's emulation, MPI's staged copies).
  virtual std::unique_ptr<PendingWork> reduceScatterAsync(const at::Tensor& input,
                                                          at::Tensor& output, ReduceOp op) = 0;
  /// Every rank's `output` (W x n elements) receives rank r's `input` (n elements)
  /// at [r n, (r+1) n): the inverse of reduceScatter's layout.
  void allgatherInto(const at::Tensor& input, at::Tensor& output);
  /// Starts an allgatherInto, with reduceScatterAsync's lifetime rules.
  virtual std::unique_ptr<PendingWork> allgatherIntoAsync(const at::Tensor& input,
                                                          at::Tensor& output) = 0;
  /// True when this backend runs both flat collectives natively (nccl, mpi); false
  /// when they are emulated (gloo: reduce-scatter by an allreduce, 2x the bytes of
  /// the native one; Note [flat collectives]).
  virtual bool nativeFlatCollectives() const = 0;

  // Scalar helpers: small CPU-side values agreed over the ranks (one collective each).

  /// Reduces each element of `values` over the ranks.
  std::vector<double> allreduce(const std::vector<double>& values, ReduceOp op);
  double allreduce(double value, ReduceOp op);
  /// True on every rank if `flag` is true on any rank.
  bool any(bool flag);
  /// Every rank's value, indexed by rank.
  std::vector<double> allgather(double value);
  /// Root's string on every rank (two broadcasts: length, then bytes).
  std::string broadcast(const std::string& value, int root);
};

}  // namespace batchdist::collective
