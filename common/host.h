#pragma once
// The host name files written per host are named after (TensorBoard's event
// files, the profiler's traces). Header-only: the event-file library links no
// worker code (Note [event file library] in worker/CMakeLists.txt).

#include <unistd.h>

#include <string>

namespace batchdist {

/// This machine's host name; "localhost" when it has none.
inline std::string hostName() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "localhost";
  return host;
}

}  // namespace batchdist
