#include "worker/data/sources/image_folder.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "collective/error.h"

namespace batchdist::worker {
namespace {

// Symlinked directories are followed (as torchvision's os.walk(followlinks=True));
// a link back to an ancestor is skipped and the depth is bounded besides.
constexpr int kMaxDepth = 64;

std::string join(const std::string& a, const std::string& b) {
  if (a.empty() || a == ".") return b;
  return a + "/" + b;
}

std::string absPath(const std::string& root, const std::string& rel) {
  return rel == "." ? root : root + "/" + rel;
}

int64_t mtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

bool isImageName(const std::string& name) {
  if (name.empty() || name[0] == '.') return false;  // hidden, e.g. macOS "._x.jpg"
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return false;
  std::string ext = name.substr(dot + 1);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}

struct DirEntry {
  std::string name;
  unsigned char type;  ///< readdir's d_type: DT_REG/DT_DIR are trusted, others stat()ed
  bool operator<(const DirEntry& o) const { return name < o.name; }
};

/// The entries of a directory (not "." / ".."), sorted by name (byte order).
std::vector<DirEntry> listDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    throw ConfigError(strCat("data.path: cannot list ", dir, ": ", std::strerror(errno)));
  }
  std::vector<DirEntry> entries;
  while (struct dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") entries.push_back(DirEntry{n, e->d_type});
  }
  ::closedir(d);
  std::sort(entries.begin(), entries.end());
  return entries;
}

struct Walker {
  std::string root;
  ImageList* list;

  /// stat() following links; false if it does not exist.
  bool statPath(const std::string& rel, struct stat* st) {
    return ::stat(absPath(root, rel).c_str(), st) == 0;
  }

  void recordDir(const std::string& rel, const struct stat& st) {
    list->dirs.emplace_back(rel, mtimeNs(st));
  }

  /// Class folder names of a split (directories under ROOT/<split>), sorted.
  std::vector<std::string> classesOf(const std::string& split) {
    std::vector<std::string> out;
    for (const auto& [n, type] : listDir(absPath(root, split))) {
      struct stat st;
      if (!statPath(join(split, n), &st)) {
        ++list->skipped;  // dangling link
        continue;
      }
      if (S_ISDIR(st.st_mode)) {
        out.push_back(n);
      } else {
        ++list->skipped;  // a file beside the class folders
      }
    }
    return out;
  }

  /// Collects the image files under `rel` (relative to ROOT), recursively.
  void walk(const std::string& rel, int depth, std::vector<std::pair<dev_t, ino_t>>* ancestors,
            std::vector<std::string>* files) {
    struct stat st;
    if (!statPath(rel, &st)) {
      throw ConfigError(strCat("data.path: cannot stat ", absPath(root, rel), ": ",
                               std::strerror(errno)));
    }
    recordDir(rel, st);
    ancestors->emplace_back(st.st_dev, st.st_ino);
    for (const auto& [n, type] : listDir(absPath(root, rel))) {
      const std::string child = join(rel, n);
      if (type == DT_REG) {  // most entries: no stat() needed (a walk of ImageNet on NFS)
        if (isImageName(n)) {
          files->push_back(child);
        } else {
          ++list->skipped;
        }
        continue;
      }
      struct stat cst;
      if (!statPath(child, &cst)) {
        ++list->skipped;  // dangling link
        continue;
      }
      if (S_ISDIR(cst.st_mode)) {
        const bool loop = std::find(ancestors->begin(), ancestors->end(),
                                    std::make_pair(cst.st_dev, cst.st_ino)) != ancestors->end();
        if (loop || depth + 1 > kMaxDepth) continue;
        walk(child, depth + 1, ancestors, files);
      } else if (S_ISREG(cst.st_mode) && isImageName(n)) {
        files->push_back(child);
      } else {
        ++list->skipped;
      }
    }
    ancestors->pop_back();
  }

  void walkSplit(const std::string& split, const std::vector<std::string>& classes,
                 std::vector<ImageEntry>* out) {
    for (size_t label = 0; label < classes.size(); ++label) {
      const std::string dir = join(split, classes[label]);
      std::vector<std::string> files;
      std::vector<std::pair<dev_t, ino_t>> ancestors;
      struct stat st;
      if (statPath(split, &st)) ancestors.emplace_back(st.st_dev, st.st_ino);
      walk(dir, 0, &ancestors, &files);
      if (files.empty()) {
        throw ConfigError(strCat("data.path: class '", classes[label], "' has no image in ",
                                 absPath(root, dir),
                                 " (expected .jpg/.jpeg/.png files, any depth); remove the "
                                 "folder or add images"));
      }
      std::sort(files.begin(), files.end());
      for (auto& f : files) out->push_back(ImageEntry{std::move(f), static_cast<int64_t>(label)});
    }
  }
};

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

}  // namespace

ImageList walkImageFolder(const std::string& root_in) {
  std::string root = root_in;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  ImageList list;
  Walker w{root, &list};
  struct stat st;
  if (::stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw ConfigError(strCat("data.path: ", root, " is not a directory (expected an image "
                             "folder ROOT/train/<class>/...)"));
  }
  w.recordDir(".", st);
  struct stat tst;
  if (!w.statPath("train", &tst) || !S_ISDIR(tst.st_mode)) {
    throw ConfigError(strCat("data.path: ", root,
                             " has no train/ folder (expected ROOT/train/<class>/...)"));
  }
  w.recordDir("train", tst);
  list.classes = w.classesOf("train");
  if (list.classes.empty()) {
    throw ConfigError(strCat("data.path: ", root, "/train has no class folder (expected ROOT/"
                             "train/<class>/<image>, one folder per class)"));
  }
  struct stat vst;
  list.has_val = w.statPath("val", &vst) && S_ISDIR(vst.st_mode);
  std::vector<std::string> val_classes;
  if (list.has_val) {
    w.recordDir("val", vst);
    val_classes = w.classesOf("val");
    for (const auto& c : val_classes) {
      if (!std::binary_search(list.classes.begin(), list.classes.end(), c)) {
        throw ConfigError(strCat("data.path: class '", c, "' is in ", root, "/val but not in ",
                                 root, "/train; both splits need the same class folders"));
      }
    }
    for (const auto& c : list.classes) {
      if (!std::binary_search(val_classes.begin(), val_classes.end(), c)) {
        throw ConfigError(strCat("data.path: class '", c, "' is in ", root, "/train but not in ",
                                 root, "/val; both splits need the same class folders"));
      }
    }
  }
  w.walkSplit("train", list.classes, &list.train);
  if (list.has_val) w.walkSplit("val", list.classes, &list.val);
  return list;
}

std::vector<ImageEntry> readImageList(const std::string& list_path, int64_t* classes) {
  // Note [data files are regular files]: /dev/zero is one endless line.
  struct stat st {};
  if (::stat(list_path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    throw ConfigError(strCat("data.list: ", list_path, " is not a regular file (",
                             S_ISDIR(st.st_mode) ? "a directory" : "a device, pipe or socket",
                             "); give a text file of \"relative/path label\" lines"));
  }
  std::ifstream in(list_path, std::ios::binary);
  if (!in) {
    throw ConfigError(strCat("data.list: cannot read ", list_path, ": ", std::strerror(errno)));
  }
  std::vector<ImageEntry> out;
  int64_t max_label = -1;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#') continue;
    size_t sep = t.size();
    while (sep > 0 && !std::isspace(static_cast<unsigned char>(t[sep - 1]))) --sep;
    if (sep == 0) {
      throw ConfigError(strCat(list_path, ":", lineno, ": expected \"relative/path label\", got \"",
                               t, "\""));
    }
    const std::string field = t.substr(sep);
    const std::string path = trim(t.substr(0, sep));
    int64_t label = 0;
    bool ok = !field.empty() && field.size() <= 12;
    for (char c : field) ok = ok && c >= '0' && c <= '9';
    if (ok) label = std::stoll(field);
    if (!ok || label > std::numeric_limits<int32_t>::max()) {
      throw ConfigError(strCat(list_path, ":", lineno, ": the label '", field,
                               "' is not a non-negative integer (a line is \"relative/path label\")"));
    }
    max_label = std::max(max_label, label);
    out.push_back(ImageEntry{path, label});
  }
  if (in.bad()) {
    throw ConfigError(strCat("data.list: error reading ", list_path, ": ", std::strerror(errno)));
  }
  if (out.empty()) {
    throw ConfigError(strCat(list_path, ": no entries (expected lines \"relative/path label\")"));
  }
  if (classes != nullptr) *classes = max_label + 1;
  return out;
}

// The text form: a version line, then counted sections; every string is written
// as "<bytes> <raw bytes>" so any name round-trips; "end" last (a truncated file
// is rejected).
namespace {
constexpr char kListMagic[] = "batchdist-image-list 1";

void putString(std::ostringstream& os, const std::string& s) { os << s.size() << ' ' << s; }

class ListReader {
 public:
  ListReader(const std::string& text, const std::string& source) : s_(text), source_(source) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw ConfigError(strCat(source_, ": malformed image list (", what, " at byte ", i_,
                             "); delete the file to have the folder walked again"));
  }
  void literal(const std::string& word) {
    if (s_.compare(i_, word.size(), word) != 0) fail(strCat("expected '", word, "'"));
    i_ += word.size();
  }
  void ch(char c) {
    if (i_ >= s_.size() || s_[i_] != c) fail(c == '\n' ? "expected a line end" : strCat("expected '", c, "'"));
    ++i_;
  }
  int64_t integer(bool allow_negative) {
    bool neg = false;
    if (allow_negative && i_ < s_.size() && s_[i_] == '-') {
      neg = true;
      ++i_;
    }
    if (i_ >= s_.size() || s_[i_] < '0' || s_[i_] > '9') fail("expected a number");
    int64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) fail("a number too large");
      v = v * 10 + (s_[i_] - '0');
      ++i_;
    }
    return neg ? -v : v;
  }
  std::string string() {
    const int64_t n = integer(false);
    ch(' ');
    if (static_cast<uint64_t>(n) > s_.size() - i_) fail("a string longer than the text");
    std::string v = s_.substr(i_, static_cast<size_t>(n));
    i_ += static_cast<size_t>(n);
    return v;
  }
  /// A count: at least `min_bytes` of text per item must remain.
  int64_t count(size_t min_bytes) {
    const int64_t n = integer(false);
    if (static_cast<uint64_t>(n) > (s_.size() - i_) / min_bytes) fail("a count larger than the text");
    return n;
  }
  bool atEnd() const { return i_ == s_.size(); }

 private:
  const std::string& s_;
  const std::string& source_;
  size_t i_ = 0;
};

void readEntries(ListReader& r, const char* section, int64_t classes, std::vector<ImageEntry>* out) {
  r.literal(section);
  r.ch(' ');
  const int64_t n = r.count(6);
  r.ch('\n');
  out->reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    ImageEntry e;
    e.label = r.integer(false);
    if (e.label >= classes) r.fail(strCat("label ", e.label, " not below the class count ", classes));
    r.ch(' ');
    e.path = r.string();
    r.ch('\n');
    out->push_back(std::move(e));
  }
}

}  // namespace

std::string serializeImageList(const ImageList& list) {
  std::ostringstream os;
  os << kListMagic << '\n';
  os << "has_val " << (list.has_val ? 1 : 0) << '\n';
  os << "skipped " << list.skipped << '\n';
  os << "classes " << list.classes.size() << '\n';
  for (const auto& c : list.classes) {
    putString(os, c);
    os << '\n';
  }
  os << "dirs " << list.dirs.size() << '\n';
  for (const auto& [dir, mtime] : list.dirs) {
    os << mtime << ' ';
    putString(os, dir);
    os << '\n';
  }
  for (const auto* part : {&list.train, &list.val}) {
    os << (part == &list.train ? "train " : "val ") << part->size() << '\n';
    for (const auto& e : *part) {
      os << e.label << ' ';
      putString(os, e.path);
      os << '\n';
    }
  }
  os << "end\n";
  return os.str();
}

ImageList parseImageList(const std::string& text, const std::string& source) {
  ListReader r(text, source);
  ImageList list;
  r.literal(kListMagic);
  r.ch('\n');
  r.literal("has_val ");
  const int64_t has_val = r.integer(false);
  if (has_val > 1) r.fail("has_val not 0 or 1");
  list.has_val = has_val == 1;
  r.ch('\n');
  r.literal("skipped ");
  list.skipped = r.integer(false);
  r.ch('\n');
  r.literal("classes ");
  const int64_t classes = r.count(3);
  r.ch('\n');
  for (int64_t i = 0; i < classes; ++i) {
    list.classes.push_back(r.string());
    r.ch('\n');
  }
  r.literal("dirs ");
  const int64_t dirs = r.count(5);
  r.ch('\n');
  for (int64_t i = 0; i < dirs; ++i) {
    const int64_t mtime = r.integer(true);
    r.ch(' ');
    std::string dir = r.string();
    r.ch('\n');
    list.dirs.emplace_back(std::move(dir), mtime);
  }
  readEntries(r, "train", classes, &list.train);
  readEntries(r, "val", classes, &list.val);
  if (!list.has_val && !list.val.empty()) r.fail("val entries without has_val");
  r.literal("end\n");
  if (!r.atEnd()) r.fail("text after 'end'");
  return list;
}

bool imageListCurrent(const ImageList& list, const std::string& root_in) {
  std::string root = root_in;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  if (list.dirs.empty()) return false;  // nothing recorded: cannot tell
  for (const auto& [dir, mtime] : list.dirs) {
    struct stat st;
    if (::stat(absPath(root, dir).c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    if (mtimeNs(st) != mtime) return false;
  }
  return true;
}

}  // namespace batchdist::worker
