#pragma once
// Several ranks as threads of one test process: each thread joins a Gloo process
// group over a shared c10d HashStore (STYLE.md: collectives tested "as threads").

#include <chrono>
#include <exception>
#include <thread>
#include <vector>

#include "collective/process_group.h"
#include "collective/torch_compat.h"

namespace batchdist::testsupport {

/// Runs fn(comm) on `world` threads, each its own rank; rethrows the first failure.
template <typename F>
void runRanks(int world, F fn, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        collective::BackendOptions o;
        o.backend = "gloo";
        o.address = "127.0.0.1";
        o.timeout = timeout;
        auto comm = collective::createCommunicator(store, r, world, o);
        fn(*comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace batchdist::testsupport
