#pragma once
// Memory probes shared by the batch search and training: is an exception an
// out-of-memory, and how much memory did this process use at its peak.

#include <c10/core/Device.h>

#include <exception>

namespace batchdist::worker {

/// True if `e` means "out of memory" (CUDA/CPU allocator, cuDNN/cuBLAS allocation).
bool isOutOfMemory(const std::exception& e);

/// Note [host allocator]: on the CPU every training step frees and re-allocates
/// the same activation tensors. glibc serves large ones with mmap and gives them
/// back with munmap, so each step page-faults (and zeroes) its memory afresh, and
/// how often depends on the history of sizes the process allocated (the dynamic
/// mmap threshold): the same per-GPU batch measured 2.7k or 5.2k samples/s in one
/// process or another. Serving every block from the heap and keeping freed memory
/// (no mmap, a 1 GB trim threshold) makes a step's cost a function of its batch
/// alone, the same in the search and in training, and faster. resetPeakRss()
/// still trims, so peak memory is not inflated by what an earlier batch left.
void configureHostAllocator();

/// This process's peak resident memory (MB) since the last resetPeakRss().
double peakRssMb();
void resetPeakRss();

/// The peak memory (MB) of `device` since the last resetPeakMemory(device): the
/// CUDA allocator's peak allocated bytes, or on the CPU the process's resident
/// memory (peakRssMb).
double peakMemoryMb(const at::Device& device);
void resetPeakMemory(const at::Device& device);

}  // namespace batchdist::worker
