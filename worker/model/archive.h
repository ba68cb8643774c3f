#pragma once
// LibTorch's serialize archives to and from bytes (the optimizer's state, the
// checkpoint's model.pt and rng.pt).

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <sstream>
#include <string>

namespace batchdist::worker {

/// What `archive` would write to a file.
inline std::string archiveBytes(torch::serialize::OutputArchive& archive) {
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

/// Loads `bytes` (written by archiveBytes or a file's content) into `archive`,
/// its tensors onto `device`.
inline void loadArchiveBytes(torch::serialize::InputArchive& archive, const std::string& bytes,
                             const at::Device& device) {
  std::istringstream in(bytes);
  archive.load_from(in, device);
}

}  // namespace batchdist::worker
