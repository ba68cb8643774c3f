#pragma once
// batchdist's own phases as named ranges in a profiler trace.
//
// Note [trace ranges]
// ~~~~~~~~~~~~~~~~~~~
// A reader of a trace must see where a step's time goes without guessing from
// kernel names, so every phase batchdist runs is a range named "batchdist/...":
// the step ("ProfilerStep#N", the name torch.profiler gives it and TensorBoard's
// profiler plugin splits steps by), data wait, host-to-device copy, forward,
// backward, each gradient bucket's collective from launch to completion, the
// gradient sync's exposed wait (where the step's wishes are agreed), the
// optimizer. A range is an at::RecordFunction of user scope: LibTorch's profiler
// (Kineto on 2.x, its CPU collection on 1.13) records it as a "user_annotation",
// beside the operators. With no profiler on, a range costs the check
// at::RecordFunction makes anyway for every operator (no callbacks: nothing is
// recorded or allocated). The profiler records the threads it was enabled on:
// a collective's range begins on the thread that launches it and may end on the
// backend's (Gloo's worker thread marks the work done), so it carries the
// launching thread's state there (AsyncRange). worker/train/observe/profiler.h turns the
// profiler on and off (Note [step profiler]).

#include <ATen/ThreadLocalState.h>
#include <ATen/record_function.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace batchdist::trace {

/// A range from construction to destruction on this thread.
class Range {
 public:
  explicit Range(const char* name) : rf_(at::RecordScope::USER_SCOPE) {
    if (rf_.isActive()) rf_.before(name);
  }
  explicit Range(const std::string& name) : rf_(at::RecordScope::USER_SCOPE) {
    if (rf_.isActive()) rf_.before(name);
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  at::RecordFunction rf_;
};

/// A range begun on this thread and ended on any (end() once; later calls and
/// the destructor do nothing more). Cheap when no profiler is on: nothing is
/// kept.
class AsyncRange {
 public:
  explicit AsyncRange(const std::string& name) {
    if (!at::hasCallbacks()) return;
    auto rf = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
    if (!rf->isActive()) return;
    rf->before(name);
    rf_ = std::move(rf);
    state_.emplace();  // the launching thread's profiler state, for end() elsewhere
  }
  ~AsyncRange() { end(); }
  AsyncRange(const AsyncRange&) = delete;
  AsyncRange& operator=(const AsyncRange&) = delete;

  bool active() const { return rf_ != nullptr; }
  void end() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!rf_) return;
    at::ThreadLocalStateGuard guard(*state_);
    rf_->end();
    rf_.reset();
  }

 private:
  std::mutex mu_;
  std::unique_ptr<at::RecordFunction> rf_;
  std::optional<at::ThreadLocalState> state_;
};

/// Whether a profiler has callbacks registered now (a range would be recorded).
inline bool on() { return at::hasCallbacks(); }

}  // namespace batchdist::trace
