// Note [error text]: what a caught exception brings to batchdist's messages.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "common/error.h"
#include "worker/common/torch_error.h"

namespace batchdist {
namespace {

c10::Error torchError(const std::string& message) {
  try {
    TORCH_CHECK(false, message);
  } catch (const c10::Error& e) {
    return e;
  }
  throw std::logic_error("TORCH_CHECK(false) did not throw");
}

TEST(ErrorText, FirstLineDropsWhatFollowsAndTheClosingPeriod) {
  EXPECT_EQ(firstLine("Connection refused.\nException raised from connect at tcp.cpp:1"),
            "Connection refused");
  EXPECT_EQ(firstLine("Timed out!  "), "Timed out");
  EXPECT_EQ(firstLine("version 1.2 of the file"), "version 1.2 of the file");
  EXPECT_EQ(firstLine("\nsecond"), "");
  EXPECT_EQ(firstLine(""), "");
}

TEST(ErrorText, FirstLineOfATorchErrorHasNoBacktrace) {
  const c10::Error e = torchError("shape mismatch: [2, 3] and [4].\ncalled from the module");
  EXPECT_EQ(firstLine(e.what()), "shape mismatch: [2, 3] and [4]");
}

TEST(ErrorText, MessageOfKeepsEveryLineButNotTheBacktrace) {
  const c10::Error e = torchError("The following operation failed\nRuntimeError: the cause");
  const std::string m = worker::messageOf(e);
  EXPECT_EQ(m.rfind("The following operation failed\nRuntimeError: the cause", 0), 0u) << m;
  EXPECT_EQ(m.find("Exception raised from"), std::string::npos) << m;
  EXPECT_NE(std::string(e.what()).find("Exception raised from"), std::string::npos)
      << "the backtrace this test expects messageOf to drop is not in what(): " << e.what();
  EXPECT_EQ(worker::messageOf(std::runtime_error("a\nb.")), "a\nb.");
}

}  // namespace
}  // namespace batchdist
