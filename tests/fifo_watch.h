#pragma once
// Note [input files are regular files]: a test that a reader does not wait on a
// FIFO must fail, not hang, when it does: a reader blocked in open() is let go by
// a writer that opens the FIFO, and the test fails saying so.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

namespace batchdist::testsupport {

/// Runs `fn`, which must not wait on the FIFO `fifo`: when it still runs after
/// 5 s, a writer opens the FIFO (so that open() returns) and the test fails.
inline void expectNoWaitOn(const std::string& fifo, const std::function<void()>& fn) {
  std::atomic<bool> done{false}, waited{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 500 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    while (!done) {
      waited = true;
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) ::close(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  fn();
  done = true;
  watchdog.join();
  EXPECT_FALSE(waited) << "waited in open() for a writer of " << fifo;
}

}  // namespace batchdist::testsupport
