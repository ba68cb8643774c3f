// main() of the one-process GoogleTest binaries that load LibTorch: Note [libstdc++
// first]'s guard (common/stdlib_guard.h), as batchdist's own main() runs it, then
// the tests.
#include <gtest/gtest.h>

#include "common/stdlib_guard.h"

int main(int argc, char** argv) {
  batchdist::ensureSystemStdlib();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
