// Note [libstdc++ first]: this test binary's std::filesystem binds to libstdc++.so.6
// (the link, else the guard in tests/test_main.cc). tests/stdlib_binding_test.sh
// runs it with the order forced wrong, with and without the guard.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/stdlib_guard.h"

namespace {

TEST(StdlibGuard, StdFilesystemBindsToLibstdcxx) {
  EXPECT_TRUE(std::filesystem::exists("/"));  // the binary uses std::filesystem
  const std::string provider = batchdist::stdFilesystemProvider();
  ASSERT_FALSE(provider.empty());
  EXPECT_TRUE(batchdist::isLibstdcxx(provider)) << "std::filesystem binds to " << provider;
  EXPECT_TRUE(batchdist::isLibstdcxx(batchdist::loadedLibstdcxx()));
}

TEST(StdlibGuard, OnlyLibstdcxxItselfCounts) {
  EXPECT_TRUE(batchdist::isLibstdcxx("/usr/lib/x86_64-linux-gnu/libstdc++.so.6"));
  EXPECT_TRUE(batchdist::isLibstdcxx("libstdc++.so.6"));
  EXPECT_FALSE(batchdist::isLibstdcxx("/venv/torch/lib/libtorch_cpu.so"));
  EXPECT_FALSE(batchdist::isLibstdcxx("/opt/libstdc++/libtorch_cpu.so"));
  EXPECT_FALSE(batchdist::isLibstdcxx(""));
}

TEST(StdlibGuard, TheProgramItselfIsNoFault) {
  EXPECT_TRUE(batchdist::isThisProgram("/proc/self/exe"));
  EXPECT_FALSE(batchdist::isThisProgram(batchdist::loadedLibstdcxx()));
  EXPECT_FALSE(batchdist::isThisProgram("/no/such/file"));
}

}  // namespace
