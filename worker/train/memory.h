#pragma once
// Memory probes shared by the batch search and training: is an exception an
// out-of-memory, and how much memory did this process use at its peak.

#include <exception>

namespace batchdist::worker {

/// True if `e` means "out of memory" (CUDA/CPU allocator, cuDNN/cuBLAS allocation).
bool isOutOfMemory(const std::exception& e);

/// This process's peak resident memory (MB) since the last resetPeakRss().
double peakRssMb();
void resetPeakRss();

}  // namespace batchdist::worker
