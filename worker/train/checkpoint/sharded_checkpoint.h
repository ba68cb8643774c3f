#pragma once
// The optimizer state of a dist.shard: optimizer run in a checkpoint (Note
// [sharded checkpoint]): written slice by slice, read by any slicing.

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "worker/train/checkpoint/manifest.h"

namespace batchdist::worker {

class Optimizer;
class ShardedOptimizer;

/// Note [sharded checkpoint]: under dist.shard: optimizer or gradients no rank
/// holds the whole optimizer state, and none gathers it: the checkpoint holds
/// optimizer_state.bin instead of optimizer.pt, the state as Note [optimizer state
/// vectors] over the packed space of Note [shard layout] (the parameters end to
/// end, no pad: the same for ZeRO-1's one segment and ZeRO-2's several):
///   a 64-byte header (magic "bdopt001", K vectors, P parameters, N elements,
///   element bytes, dtype, 2 reserved words), P int64 step counts (one per
///   parameter), then K vectors of N elements each, in flat order.
/// Written like rng.pt (Note [rng records]): the file is cut into chunks of at most
/// C bytes (16 MiB), one int64 allreduce each, in which the ranks owning a part of
/// the chunk place their bytes and everyone else zeros (the sum is the bytes, bit
/// for bit: no two ranks place a byte in the same position), and rank 0 appends
/// each chunk as it arrives. Rank 0 holds one chunk at a time; every rank copies
/// its own parts of one vector to the CPU at a time (1/W of it). The file count
/// stays the same for any W. Since the layout without pad does not depend on W:
///  - a resume at any world size W' (and either sharding) reads, on rank r', only
///    its own parts of each vector (one seek and one read per run of pieces
///    consecutive in the packed space: one under ZeRO-1, about one per segment
///    under ZeRO-2) and gives each piece its part;
///  - an unsharded run reads every parameter's range of every vector into its
///    whole optimizer (sharded -> unsharded);
///  - a sharded run resuming an unsharded checkpoint (optimizer.pt) loads it into
///    a whole optimizer over the same parameters, then copies each piece's range:
///    for that one load the rank holds the whole state (unsharded -> sharded).
/// The step counts are the largest over the pieces of a parameter (one allreduce of
/// P values): every piece of a parameter steps together.

/// Collective: streams `opt`'s state to `sink` on rank 0 (header, steps, vectors),
/// chunks of at most `chunk_bytes`; returns the manifest's "optimizer_state" entry
/// (without its file's name, size and checksum, which the sink's owner adds).
FlatStateEntry gatherShardedState(ShardedOptimizer& opt, collective::Communicator& comm,
                                          std::size_t chunk_bytes,
                                          const std::function<void(const char*, std::size_t)>& sink);

/// Restores `file` (`entry`: the manifest's "optimizer_state") into `opt`. Under
/// dist.shard: optimizer `sharded` is `opt` and this rank reads its slice only;
/// otherwise `opt` is a whole optimizer over `params` (in order) and reads all.
/// Throws Error when the file does not fit this optimizer and model.
void restoreFlatState(const std::string& file, const FlatStateEntry& entry,
                      Optimizer& opt, const ShardedOptimizer* sharded,
                      const std::vector<at::Tensor>& params);

/// An unsharded checkpoint's optimizer.pt (`bytes`) into a sharded optimizer.
void restoreWholeIntoSharded(const std::string& bytes, ShardedOptimizer& opt,
                             const at::Device& device);

}  // namespace batchdist::worker
