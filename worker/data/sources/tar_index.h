#pragma once
// Note [tar index]: a WebDataset shard is read by offset, not as a stream. The
// plan needs the exact sample count and equal shards and resume need exact
// positions, so each tar's headers are walked once (512-byte records, seeking
// over member data; no image byte is read) and a sample is then one pread of its
// image member. No LibTorch here.

#include <cstdint>
#include <string>
#include <vector>

namespace batchdist::worker {

/// One sample of a shard: the run of adjacent members sharing a key (the member
/// name up to the first dot of its base name).
struct TarSample {
  std::string key;
  int64_t image_offset = 0;  ///< byte offset of the image member's data in the tar
  int64_t image_size = 0;
  std::string image_member;  ///< its member name (for messages)
  int64_t label = -1;        ///< the `cls` member, parsed as an ASCII integer
};

struct TarShard {
  std::string path;
  std::vector<TarSample> samples;
  int64_t skipped_members = 0;  ///< members of no sample kind (e.g. .json), counted
};

/// Walks the headers of the tar at `path` (ustar, GNU long names, pax `path`
/// records). Images are the `jpg`/`jpeg`/`png` members (any case), the label the
/// `cls` member. Throws ConfigError naming the file, the member and its offset for:
/// a truncated archive, a bad header checksum, a sample without `cls` or without
/// an image, a label that is not an integer, a key that repeats an extension.
TarShard indexTar(const std::string& path);

/// Expands WebDataset's brace pattern: "train-{000000..000127}.tar" (zero
/// padding kept, several braces allowed) or "a-{x,y}.tar"; a directory gives its
/// `.tar` files, sorted. Throws ConfigError on a malformed pattern or no match.
std::vector<std::string> expandShards(const std::string& pattern);

}  // namespace batchdist::worker
