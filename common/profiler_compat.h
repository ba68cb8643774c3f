#pragma once
// Note [torch compat], profiler part: LibTorch's profiler across 1.13 (Debian,
// built without Kineto: the CPU collection, no trace file) and 2.x (Kineto). The
// API batchdist uses (ProfilerConfig, prepareProfiler, enableProfiler,
// disableProfiler, ProfilerResult) is the same in both; an event's times are
// not: microseconds in 1.13 (startUs, durationUs), nanoseconds in 2.x (startNs,
// durationNs).

#include <torch/csrc/autograd/profiler_kineto.h>

#include <cstdint>
#include <type_traits>
#include <utility>

namespace batchdist::compat {
namespace detail {
template <typename E, typename = void>
struct HasStartNs : std::false_type {};
template <typename E>
struct HasStartNs<E, std::void_t<decltype(std::declval<const E&>().startNs())>> : std::true_type {};
}  // namespace detail

using ProfilerEvent = torch::autograd::profiler::KinetoEvent;

/// The event's start, in microseconds on the profiler's clock.
template <typename E = ProfilerEvent>
uint64_t eventStartUs(const E& e) {
  if constexpr (detail::HasStartNs<E>::value) {
    return e.startNs() / 1000;
  } else {
    return e.startUs();
  }
}

/// The event's duration in microseconds.
template <typename E = ProfilerEvent>
uint64_t eventDurationUs(const E& e) {
  if constexpr (detail::HasStartNs<E>::value) {
    return e.durationNs() / 1000;
  } else {
    return e.durationUs();
  }
}

}  // namespace batchdist::compat
