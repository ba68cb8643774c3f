#pragma once
// torchvision's ImageFolder layout: ROOT/<split>/<class>/**/<image>. No LibTorch here.

#include <cstdint>
#include <string>
#include <vector>

namespace batchdist::worker {

struct ImageEntry {
  std::string path;  ///< relative to the folder's root (ROOT), '/'-separated
  int64_t label = 0;
};

struct ImageList {
  std::vector<std::string> classes;  ///< sorted class folder names (byte order)
  std::vector<ImageEntry> train;
  std::vector<ImageEntry> val;       ///< empty when there is no ROOT/val
  bool has_val = false;
  int64_t skipped = 0;               ///< files that are not .jpg/.jpeg/.png (any case)
  /// Every directory walked and its modification time (ns): the cache key.
  std::vector<std::pair<std::string, int64_t>> dirs;
};

/// Walks ROOT/train (and ROOT/val if present): classes are the sorted names of
/// train's class folders, labels their index; files under a class folder are
/// found recursively, in sorted order. Throws ConfigError: no ROOT/train, no
/// class folder, a class with no image, a class in one split and not the other
/// (named).
ImageList walkImageFolder(const std::string& root);

/// Reads `data.list`: one "relative/path label" per line (paths relative to
/// `root`, may contain spaces: the label is the last field). Classes are
/// "0".."max label". Throws ConfigError naming file:line.
std::vector<ImageEntry> readImageList(const std::string& list_path, int64_t* classes);

/// The list as text and back (rank 0 hands it to the others; the cache file).
std::string serializeImageList(const ImageList& list);
ImageList parseImageList(const std::string& text, const std::string& source);

/// True when every directory in `list.dirs` still has its recorded mtime (so the
/// list is current without walking the files again).
bool imageListCurrent(const ImageList& list, const std::string& root);

}  // namespace batchdist::worker
