#pragma once
// The message of an exception a user's own code threw (Note [error text] in
// common/error.h).

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace batchdist::worker {

/// The whole message of `e`, without the backtrace a c10::Error appends: a
/// program's module or data set may throw either kind, and a TorchScript
/// error's cause is on its last line, so it is not cut to the first.
inline std::string messageOf(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

}  // namespace batchdist::worker
