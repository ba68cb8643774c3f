#include "collective/flat_collectives.h"

#include <ATen/ATen.h>

#include <utility>

#include "common/error.h"

namespace batchdist::collective {
namespace {

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  return strCat(t.dim(), "-D ", t.sizes(), " ", t.scalar_type(), " on ", t.device().str(),
                t.is_contiguous() ? "" : ", not contiguous");
}

/// Whether the byte ranges of two contiguous tensors on one device meet.
bool overlap(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0 || a.device() != b.device()) return false;
  const auto* a0 = static_cast<const char*>(a.data_ptr());
  const auto* b0 = static_cast<const char*>(b.data_ptr());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

/// Whether `part` is exactly `whole`'s slot of `rank` (n elements at r n).
bool isSlot(const at::Tensor& part, const at::Tensor& whole, int rank, int64_t n) {
  const auto* slot = static_cast<const char*>(whole.data_ptr()) + rank * n * whole.element_size();
  return part.numel() == n && part.data_ptr() == static_cast<const void*>(slot);
}

/// The first rule `input` and `output` break, or "" (Note [flat collectives]).
std::string firstProblem(const at::Tensor& whole, const at::Tensor& part, const char* whole_name,
                         const char* part_name, int rank, int size) {
  for (const auto& [t, name] : {std::pair{whole, whole_name}, std::pair{part, part_name}}) {
    if (!t.defined()) return strCat(name, " is undefined");
    if (t.dim() != 1) return strCat(name, " is ", t.dim(), "-D; pass a flat view (view(-1))");
    if (!t.is_contiguous()) return strCat(name, " is not contiguous");
  }
  if (whole.scalar_type() != part.scalar_type()) return "input and output differ in dtype";
  if (whole.device() != part.device()) return "input and output are on different devices";
  if (whole.numel() != size * part.numel()) {
    return strCat(whole_name, " has ", whole.numel(), " elements, not ", size, " x the ",
                  part.numel(), " of ", part_name);
  }
  if (overlap(whole, part) && !isSlot(part, whole, rank, part.numel())) {
    return strCat(part_name, " overlaps ", whole_name, " other than as this rank's slot [",
                  rank * part.numel(), ", ", (rank + 1) * part.numel(), ")");
  }
  return "";
}

class FinishedWork : public PendingWork {
 public:
  void wait() override {}
  void trace(const std::string&) override {}  // nothing was sent
};

/// Waits for an allreduce of `buffer`, then copies the rank's slice into `output`.
class SliceAfterWork : public PendingWork {
 public:
  SliceAfterWork(std::unique_ptr<PendingWork> inner, at::Tensor slice, at::Tensor output)
      : inner_(std::move(inner)), slice_(std::move(slice)), output_(std::move(output)) {}

  void wait() override {
    if (!inner_) return;
    inner_->wait();
    inner_.reset();
    output_.copy_(slice_);
  }
  void progress() override {
    if (inner_) inner_->progress();
  }
  void trace(const std::string& name) override {
    if (inner_) inner_->trace(name);
  }

 private:
  std::unique_ptr<PendingWork> inner_;
  at::Tensor slice_;  // a view of the allreduced clone
  at::Tensor output_;
};

}  // namespace

FlatShape checkFlat(FlatCollective kind, const at::Tensor& input, const at::Tensor& output,
                    int rank, int size, const std::string& backend) {
  const bool scatter = kind == FlatCollective::kReduceScatter;
  const at::Tensor& whole = scatter ? input : output;
  const at::Tensor& part = scatter ? output : input;
  const std::string problem = firstProblem(whole, part, scatter ? "input" : "output",
                                           scatter ? "output" : "input", rank, size);
  if (!problem.empty()) {
    throw CollectiveError(strCat(
        scatter ? "reduceScatter" : "allgatherInto", " (", backend, ", rank ", rank, " of ", size,
        "): ", problem, ". Passed: input ", describe(input), ", output ", describe(output),
        ". Both must be 1-D and contiguous, of one dtype and device, ",
        scatter ? "input W x n and output n elements (rank r receives the reduction of "
                  "every rank's slice [r n, (r+1) n))"
                : "input n and output W x n elements (rank r's input lands at [r n, (r+1) n))",
        ", W = ", size, " (Note [flat collectives])"));
  }
  FlatShape shape;
  shape.n = part.numel();
  shape.in_place = overlap(whole, part);
  return shape;
}

std::unique_ptr<PendingWork> finishedWork() { return std::make_unique<FinishedWork>(); }

std::unique_ptr<PendingWork> reduceScatterByAllreduce(Communicator& comm, const at::Tensor& input,
                                                      at::Tensor& output, ReduceOp op,
                                                      const FlatShape& shape) {
  // A clone: the caller's input stays as it was, as with the native collective
  // (and in place, output is part of it).
  auto buffer = input.clone();
  auto inner = comm.allreduceAsync(buffer, op);
  auto slice = buffer.narrow(0, comm.rank() * shape.n, shape.n);
  return std::make_unique<SliceAfterWork>(std::move(inner), std::move(slice), output);
}

}  // namespace batchdist::collective
