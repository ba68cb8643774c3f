#pragma once
// What every backend's reduceScatter and allgatherInto share: the shape rules, the
// Gloo emulation and the work types they return. Internal to collective/.
//
// Note [flat collectives]: reduceScatter and allgatherInto move one flat buffer of
// W x n elements (W ranks): rank r owns the slice [r n, (r+1) n). They are the two
// halves of an allreduce, for state sharded over the ranks (ZeRO: each rank keeps
// and updates 1/W of the optimizer state). Per rank, a bandwidth-optimal (ring)
// algorithm sends and receives
//   reduce-scatter  (W-1)/W x W n = (W-1) n elements,
//   all-gather      (W-1)/W x W n = (W-1) n elements,
//   allreduce       2 (W-1)/W x W n = 2 (W-1) n elements (the two in a row).
// Per backend:
//  - nccl: native (c10d's flat reduce-scatter / all-gather: compat::reduceScatterFlat,
//    compat::allgatherFlat), the costs above.
//  - mpi: native (MPI_Ireduce_scatter_block, MPI_Iallgather), the costs above. Half
//    and bfloat16 are reduced in float (staged copies, as the allreduce does); the
//    all-gather does no arithmetic and moves every dtype as unsigned integers of its
//    width.
//  - gloo: emulated, by the backend alone, on both LibTorch lines. 1.13's
//    ProcessGroupGloo has neither call (_allgather_base throws, _reduce_scatter_base
//    is the base class's throw); 2.x's has both, but its reduce-scatter is itself an
//    allreduce of a clone of the input (some releases even drop the reduce op: always
//    a sum) and its all-gather the list all-gather, so there is nothing to gain from
//    a version switch, and a per-call try/catch would hide real errors.
//      reduce-scatter = an allreduce of a clone of the input, then the rank's slice
//        copied out: 2 (W-1) n elements on the wire, 2x the native's, and a W n
//        temporary.
//      all-gather = Gloo's list all-gather into views of the output: the native's
//        (W-1) n elements on the wire, plus one local copy of W n (c10d gathers into
//        a flat temporary, then copies into the views). The other emulation, an
//        allreduce of a zero-filled buffer with the rank's slice placed, would move
//        2 (W-1) n: 2x.
//    So a sharded update over Gloo moves 3 (W-1) n elements per step where the plain
//    allreduce moves 2 (W-1) n: sharding there saves memory, not time.
//    Communicator::nativeFlatCollectives() says which case a run is in, so a plan
//    line can say "reduce-scatter emulated by allreduce (gloo)".
// In place: output may be exactly input's slot [r n, (r+1) n) in reduceScatter, and
// input exactly output's slot in allgatherInto (as NCCL allows; ZeRO gathers its
// parameters that way); any other overlap of input and output is refused.
// n = 0 is allowed and starts no collective (every rank passes the same n).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "collective/communicator.h"

namespace batchdist::collective {

enum class FlatCollective { kReduceScatter, kAllgatherInto };

/// The layout of one flat collective, once its tensors passed checkFlat.
struct FlatShape {
  int64_t n = 0;          ///< elements of one rank's slice
  bool in_place = false;  ///< the smaller tensor is the larger one's slot of this rank
};

/// Checks the tensors of a flat collective among `size` ranks (Note [flat
/// collectives]): both 1-D and contiguous, of one dtype and device, input W n and
/// output n elements (reduceScatter) or input n and output W n (allgatherInto),
/// overlapping only in place. Throws CollectiveError naming the call, the backend,
/// and the sizes, dtypes and devices passed.
FlatShape checkFlat(FlatCollective kind, const at::Tensor& input, const at::Tensor& output,
                    int rank, int size, const std::string& backend);

/// A work that is already complete (n = 0: nothing to move).
std::unique_ptr<PendingWork> finishedWork();

/// reduceScatter by an allreduce of a clone of `input` (Gloo; Note [flat
/// collectives]): wait() waits for the allreduce, then copies this rank's slice
/// into `output`.
std::unique_ptr<PendingWork> reduceScatterByAllreduce(Communicator& comm, const at::Tensor& input,
                                                      at::Tensor& output, ReduceOp op,
                                                      const FlatShape& shape);

}  // namespace batchdist::collective
