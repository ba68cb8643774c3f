#pragma once
// A communicator that remembers the collectives of a repeating stretch of work,
// so that a rank which leaves the stretch early can still make the ones the
// others are about to make (Note [collective replay]).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collective/communicator.h"

namespace batchdist::collective {

// Note [collective replay]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Collectives match by order (Communicator): a rank that stops in the middle of
// a stretch the others go on with (out of memory halfway through a micro-batch
// under dist.shard: parameters, whose unit all-gathers and reduce-scatters the
// others keep making) must still make every collective they make, or they wait
// for it until the timeout. When the stretch repeats (every micro-batch of every
// step makes the same collectives: the same units, in the same order, of the
// same sizes, whatever the batch), the last complete one is the pattern:
//  - begin() opens a stretch, end() closes it; a stretch closed whole becomes the
//    pattern. Each collective made through this communicator inside a stretch is
//    recorded (its kind, sizes, dtype, reduction, root), outside one it is not.
//  - replayRest(n) on the rank that left: the collectives of the pattern past the
//    ones this stretch made, then the whole pattern n times (the stretches it
//    will not run), each made at once on zeros of the recorded shape and waited
//    for. The values the others receive are wrong, which is why every rank then
//    discards the work (Note [oom back-off]). It returns false, making nothing,
//    when there is no pattern yet or when what this stretch made is not how the
//    pattern begins: the rank cannot know what the others make.
// Asynchronous collectives count when they start, as the backends order them.
class RecordingCommunicator : public Communicator {
 public:
  explicit RecordingCommunicator(Communicator& inner) : inner_(inner) {}

  /// Opens a stretch (the one open, if any, closes whole first).
  void begin();
  /// Closes the open stretch whole: it becomes the pattern.
  void end();
  /// Note [collective replay]: after leaving the open stretch early. Closes it.
  bool replayRest(int64_t whole_stretches);

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backendName() const override { return inner_.backendName(); }
  at::Device device() const override { return inner_.device(); }
  std::chrono::milliseconds timeout() const override { return inner_.timeout(); }
  bool nativeFlatCollectives() const override { return inner_.nativeFlatCollectives(); }

  using Communicator::allgather;
  using Communicator::allreduce;
  using Communicator::broadcast;
  void allreduce(at::Tensor& t, ReduceOp op) override;
  std::unique_ptr<PendingWork> allreduceAsync(at::Tensor& t, ReduceOp op) override;
  void broadcast(at::Tensor& t, int root) override;
  at::Tensor allgather(const at::Tensor& t) override;
  void barrier() override;
  std::unique_ptr<PendingWork> reduceScatterAsync(const at::Tensor& input, at::Tensor& output,
                                                  ReduceOp op) override;
  std::unique_ptr<PendingWork> allgatherIntoAsync(const at::Tensor& input,
                                                  at::Tensor& output) override;

  enum class Kind { kAllreduce, kBroadcast, kAllgather, kBarrier, kReduceScatter, kAllgatherInto };
  /// One recorded collective: enough to make it again on zeros.
  struct Op {
    Kind kind;
    std::vector<int64_t> sizes;  ///< the (input) tensor's
    at::ScalarType dtype = at::kFloat;
    ReduceOp reduce = ReduceOp::kSum;
    int root = 0;
    bool operator==(const Op& o) const {
      return kind == o.kind && sizes == o.sizes && dtype == o.dtype && reduce == o.reduce &&
             root == o.root;
    }
  };

 private:
  void record(Kind kind, const at::Tensor& t, ReduceOp reduce = ReduceOp::kSum, int root = 0);
  /// `op` made on zeros through the inner communicator, waited for.
  void makeOnZeros(const Op& op);

  Communicator& inner_;
  bool open_ = false;
  bool has_pattern_ = false;
  std::vector<Op> current_;
  std::vector<Op> pattern_;
};

}  // namespace batchdist::collective
