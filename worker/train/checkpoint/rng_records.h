#pragma once
// rng.pt: every rank's generators gathered to rank 0 as fixed-size records, and
// this rank's record read back on resume (Note [rng records]).
//
// Note [rng records]: rng.pt is a 32-byte header (magic "bdrng002", W, CPU and
// CUDA state bytes) and W records of R bytes, record r rank r's: [int64 CPU
// length][int64 CUDA length][CPU state][CUDA state], 8-byte aligned. A CPU
// generator's state is S_cpu = 5056 bytes (mt19937's 624 words and the normal
// samples' cache, LibTorch 1.13 and 2.x), a CUDA one S_cuda = 16 (Philox seed and
// offset), so R = 5072 on CPUs, 5088 on GPUs:
//        W      rng.pt      format 1: allgather (int64 a byte) on every rank
//       64     0.33 MB      2.6 MB
//     1024      5.2 MB       41 MB
//    10000       51 MB      405 MB (+ rank 0's archive, ~3 x 51 MB)
// Format 1 allgathered every state as one int64 per byte to every rank (GPU
// memory under NCCL) and built the whole torch archive in rank 0's memory; a
// resume read all of it on every rank. Now rank 0's memory is bounded: the
// records travel in chunks of K = max(1, 1 MiB / R) ranks (206 ranks), one
// allreduce each (the chunk's members write their rows, everyone else zeros:
// the int64 sum is every record bit for bit), and rank 0 appends each chunk to
// rng.pt as it arrives, hashing as it goes. Traffic per rank is ~2 W R for the
// ring (what one allgather of the bytes would cost, 8x less than format 1's), in
// ceil(W / K) collectives: 49 at W = 10000. The file count stays 4; one file
// rather than parts, since a resume seeks to its own record (32 + r R) and
// reads R bytes, whatever W is. Parts would only pay if ranks wrote their own
// records, which needs the directory shared at write time (today only resume
// needs that) and W writers racing on one file system.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include "collective/communicator.h"
#include "worker/train/checkpoint/manifest.h"

namespace batchdist::worker {

/// Every rank's CPU generator and, on a GPU, its device's CUDA generator (Note
/// [cuda rng]), streamed to `sink` on rank 0 in rank order: the header, then the
/// records, at most `chunk_bytes` of them at a time (Note [rng records]).
/// Collective: one small allreduce for the sizes, then one allreduce per chunk.
RngLayout gatherRng(collective::Communicator& comm, const at::Device& device,
                    std::size_t chunk_bytes,
                    const std::function<void(const char*, std::size_t)>& sink);

/// Restores this rank's generators from DIR/rng.pt: its record when `layout` is
/// given (the header and one record are read, whatever W is; the CUDA state on a
/// GPU when present), else format 1's torch archive of CPU generators. Throws
/// Error when the file is not what the manifest describes.
void restoreRng(const std::string& dir, const std::optional<RngLayout>& layout, int rank,
                const at::Device& device);

}  // namespace batchdist::worker
