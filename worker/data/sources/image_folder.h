#pragma once
// torchvision's ImageFolder layout: ROOT/<split>/<class>/**/<image>. No LibTorch here.

#include <cstdint>
#include <string>
#include <vector>

namespace batchdist::worker {

struct ImageEntry {
  std::string path;  ///< relative to the folder's root (ROOT), '/'-separated
  int64_t label = 0;
  int64_t line = 0;  ///< data.list: its line in the list file (for messages); 0 from a walk
};

/// A file named like an image that is not one a walk can read (a dangling
/// symlink, a FIFO, a device): named, never silently skipped.
struct BadEntry {
  std::string path;  ///< relative to ROOT, as an ImageEntry's
  std::string kind;  ///< "dangling symlink (to gone.jpg)", "FIFO", "character device", ...
};

struct ImageList {
  std::vector<std::string> classes;  ///< sorted class folder names (byte order)
  std::vector<ImageEntry> train;
  std::vector<ImageEntry> val;       ///< empty when there is no ROOT/val
  bool has_val = false;
  int64_t skipped = 0;               ///< files that are not .jpg/.jpeg/.png (any case)
  std::vector<BadEntry> bad;         ///< image names that are not regular files
  /// Every directory walked and its modification time (ns): the cache key.
  std::vector<std::pair<std::string, int64_t>> dirs;
};

/// Walks ROOT/train (and ROOT/val if present): classes are the sorted names of
/// train's class folders, labels their index; files under a class folder are
/// found recursively, in sorted order, each once (Note [each file once]). An image
/// name that is not a regular file goes to `bad`. Throws ConfigError: no
/// ROOT/train, no class folder, a class with no image, a class in one split and
/// not the other, two class folders that are one directory (named).
ImageList walkImageFolder(const std::string& root);

/// Reads `data.list`: one "relative/path label" per line (paths relative to
/// the data root, may contain spaces: the label is the last field). Classes are
/// "0".."max label". A path that leaves the root (absolute, or `..` above it) is
/// refused unless `outside_root_ok` (data.list_outside_root). Throws ConfigError
/// naming file:line.
std::vector<ImageEntry> readImageList(const std::string& list_path, int64_t* classes,
                                      bool outside_root_ok = false);

/// The list as text and back (rank 0 hands it to the others; the cache file).
std::string serializeImageList(const ImageList& list);
ImageList parseImageList(const std::string& text, const std::string& source);

/// True when every directory in `list.dirs` still has its recorded mtime (so the
/// list is current without walking the files again).
bool imageListCurrent(const ImageList& list, const std::string& root);

}  // namespace batchdist::worker
