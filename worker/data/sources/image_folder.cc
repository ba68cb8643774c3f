#include "worker/data/sources/image_folder.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "common/error.h"
#include "worker/common/files.h"

namespace batchdist::worker {
namespace {

// Note [each file once]: symlinked directories are followed (as torchvision's
// os.walk(followlinks=True)), but every directory is walked once, known by its real
// path, and the class folders' own subtrees (both splits) are walked before any link
// met in them is followed. So a link to a folder already walked (".", the class
// folder's parent, a sibling class, the other split) adds nothing; a link to ROOT or
// a folder above it is not followed (it leads back into the tree); and a file reached
// through a link (a linked folder outside the class folders, or a symlinked file)
// counts once, by its real path, under the class whose walk met it first. No walk
// loops, no sample is listed twice, and the depth is bounded besides (a bind mount).
constexpr int kMaxDepth = 64;

std::string join(const std::string& a, const std::string& b) {
  if (a.empty() || a == ".") return b;
  return a + "/" + b;
}

std::string absPath(const std::string& root, const std::string& rel) {
  return rel == "." ? root : root + "/" + rel;
}

std::string baseName(const std::string& rel) {
  const size_t slash = rel.rfind('/');
  return slash == std::string::npos ? rel : rel.substr(slash + 1);
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

/// What a file that is neither a directory nor a regular file is, for a message.
std::string kindOf(mode_t mode) {
  if (S_ISFIFO(mode)) return "FIFO";
  if (S_ISCHR(mode)) return "character device";
  if (S_ISBLK(mode)) return "block device";
  if (S_ISSOCK(mode)) return "socket";
  if (S_ISLNK(mode)) return "symlink";
  return "special file";
}

/// readdir's d_type as a stat mode type (0: unknown, lstat() it).
mode_t modeOfType(unsigned char type) {
  switch (type) {
    case DT_REG: return S_IFREG;
    case DT_DIR: return S_IFDIR;
    case DT_LNK: return S_IFLNK;
    case DT_FIFO: return S_IFIFO;
    case DT_CHR: return S_IFCHR;
    case DT_BLK: return S_IFBLK;
    case DT_SOCK: return S_IFSOCK;
    default: return 0;
  }
}

/// The resolved path of `path` ("" if it cannot be resolved).
std::string realPath(const std::string& path) {
  char* r = ::realpath(path.c_str(), nullptr);
  if (r == nullptr) return "";
  std::string out(r);
  std::free(r);
  return out;
}

std::string linkTarget(const std::string& path) {
  std::string buf(4096, '\0');
  const ssize_t n = ::readlink(path.c_str(), buf.data(), buf.size());
  return n < 0 ? std::string("?") : buf.substr(0, static_cast<size_t>(n));
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

using Files = std::vector<std::string>;

/// Note [each file once]: the walk of one folder (both splits).
struct Walker {
  std::string root;
  std::string root_real;
  ImageList* list = nullptr;
  struct Walked {
    std::string rel;   ///< the path it was first walked by
    bool images;       ///< its image files were taken (a class folder's subtree)
  };
  std::unordered_map<std::string, Walked> walked;      // by real path
  std::unordered_set<std::string> linked_files;        // real paths taken through links
  struct Link {
    std::string rel;
    int depth;
    Files* files;
  };
  std::deque<Link> links;  // followed after every class folder's own subtree

  /// stat() following links; false if it does not exist.
  bool statPath(const std::string& rel, struct stat* st) {
    return ::stat(absPath(root, rel).c_str(), st) == 0;
  }

  void recordDir(const std::string& rel, const struct stat& st) {
    list->dirs.emplace_back(rel, mtimeNs(st));
  }

  void bad(const std::string& rel, std::string kind) {
    list->bad.push_back(BadEntry{rel, std::move(kind)});
  }

  /// Class folder names of a split (directories under ROOT/<split>), sorted.
  std::vector<std::string> classesOf(const std::string& split) {
    walked.emplace(realPath(absPath(root, split)), Walked{split, false});
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

  void addFile(const std::string& rel, const std::string& real, bool via_link, Files* files) {
    if (!isImageName(baseName(rel))) {
      ++list->skipped;
      return;
    }
    if (via_link && !linked_files.insert(real).second) return;  // met through another link
    files->push_back(rel);
  }

  /// Collects the image files under `rel` (real path `real`, already marked
  /// walked), recursively; symlinks are queued for followLinks().
  void walk(const std::string& rel, const std::string& real, int depth, bool via_link, Files* files) {
    struct stat st;
    if (!statPath(rel, &st)) {
      throw ConfigError(strCat("data.path: cannot stat ", absPath(root, rel), ": ",
                               std::strerror(errno)));
    }
    recordDir(rel, st);
    for (const auto& [n, type] : listDir(absPath(root, rel))) {
      const std::string child = join(rel, n);
      mode_t mode = modeOfType(type);  // DT_REG: no stat() (a walk of ImageNet on NFS)
      if (mode == 0) {
        struct stat lst;
        if (::lstat(absPath(root, child).c_str(), &lst) != 0) continue;  // gone meanwhile
        mode = lst.st_mode & S_IFMT;
      }
      if (S_ISREG(mode)) {
        addFile(child, real + "/" + n, via_link, files);
      } else if (S_ISDIR(mode)) {
        const std::string creal = real + "/" + n;
        if (depth + 1 > kMaxDepth || !walked.emplace(creal, Walked{child, true}).second) continue;
        walk(child, creal, depth + 1, via_link, files);
      } else if (S_ISLNK(mode)) {
        links.push_back(Link{child, depth + 1, files});
      } else if (isImageName(n)) {
        bad(child, kindOf(mode));
      } else {
        ++list->skipped;
      }
    }
  }

  /// True when `real` lies in a folder whose images the walk took.
  bool takenInPlace(const std::string& real) const {
    const size_t slash = real.rfind('/');
    if (slash == std::string::npos) return false;
    const auto it = walked.find(real.substr(0, slash));
    return it != walked.end() && it->second.images && isImageName(real.substr(slash + 1));
  }

  /// ROOT or a folder above it: following it would walk the tree again.
  bool holdsRoot(const std::string& real) const {
    return real == root_real || real == "/" || root_real.rfind(real + "/", 0) == 0;
  }

  void followLink(const Link& l) {
    const std::string abs = absPath(root, l.rel);
    const std::string name = baseName(l.rel);
    struct stat st;
    if (::stat(abs.c_str(), &st) != 0) {
      const int err = errno;
      if (!isImageName(name)) {
        ++list->skipped;
      } else if (err == ENOENT || err == ENOTDIR) {
        bad(l.rel, strCat("dangling symlink (to ", linkTarget(abs), ")"));
      } else {
        bad(l.rel, strCat("symlink whose target cannot be reached (to ", linkTarget(abs), ": ",
                          std::strerror(err), ")"));
      }
      return;
    }
    const std::string real = realPath(abs);
    if (S_ISDIR(st.st_mode)) {
      if (real.empty() || holdsRoot(real) || l.depth > kMaxDepth) return;
      if (!walked.emplace(real, Walked{l.rel, true}).second) return;  // walked already
      walk(l.rel, real, l.depth, /*via_link=*/true, l.files);
    } else if (S_ISREG(st.st_mode)) {
      if (!isImageName(name)) {
        ++list->skipped;
      } else if (!takenInPlace(real)) {
        addFile(l.rel, real, /*via_link=*/true, l.files);
      }
    } else if (isImageName(name)) {
      bad(l.rel, strCat("symlink to a ", kindOf(st.st_mode), " (", linkTarget(abs), ")"));
    } else {
      ++list->skipped;
    }
  }

  /// Walks each class folder's own subtree; the files go to `files[label]`.
  void walkSplit(const std::string& split, const std::vector<std::string>& classes,
                 std::vector<Files>* files) {
    files->resize(classes.size());
    for (size_t label = 0; label < classes.size(); ++label) {
      const std::string dir = join(split, classes[label]);
      const std::string real = realPath(absPath(root, dir));
      if (holdsRoot(real)) {
        throw ConfigError(strCat("data.path: class folder ", absPath(root, dir), " leads to ", real,
                                 ", which holds the data root ", root_real,
                                 "; a class folder must be a folder of that class's images"));
      }
      const auto [it, fresh] = walked.emplace(real, Walked{dir, true});
      if (!fresh) {
        throw ConfigError(strCat("data.path: class folder ", absPath(root, dir), " is ",
                                 absPath(root, it->second.rel), " (", real,
                                 "), walked already; each class needs a folder of its own "
                                 "(a symlink to another class or split is not a class)"));
      }
      walk(dir, real, 0, /*via_link=*/false, &(*files)[label]);
    }
  }

  /// The class folders' entries, sorted, after every link was followed.
  void finishSplit(const std::string& split, const std::vector<std::string>& classes,
                   std::vector<Files>& files, std::vector<ImageEntry>* out) {
    for (size_t label = 0; label < classes.size(); ++label) {
      auto& f = files[label];
      if (f.empty()) {
        throw ConfigError(strCat("data.path: class '", classes[label], "' has no image in ",
                                 absPath(root, join(split, classes[label])),
                                 " (expected .jpg/.jpeg/.png files, any depth); remove the "
                                 "folder or add images"));
      }
      std::sort(f.begin(), f.end());
      for (auto& p : f) out->push_back(ImageEntry{std::move(p), static_cast<int64_t>(label)});
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
  struct stat st;
  if (::stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw ConfigError(strCat("data.path: ", root, " is not a directory (expected an image "
                             "folder ROOT/train/<class>/...)"));
  }
  Walker w;
  w.root = root;
  w.root_real = realPath(root);
  w.list = &list;
  w.walked.emplace(w.root_real, Walker::Walked{".", false});
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
  std::vector<Files> train, val;
  w.walkSplit("train", list.classes, &train);
  if (list.has_val) w.walkSplit("val", list.classes, &val);
  while (!w.links.empty()) {
    const Walker::Link link = w.links.front();
    w.links.pop_front();
    w.followLink(link);
  }
  w.finishSplit("train", list.classes, train, &list.train);
  if (list.has_val) w.finishSplit("val", list.classes, val, &list.val);
  return list;
}

namespace {

/// Note [list paths stay under the root]: a data.list path is relative to the data
/// root; one that leaves it (absolute, or `..` above the root; judged on the text,
/// as symlinks under the root are followed like a walk's) is refused unless the
/// user opts in with data.list_outside_root, so a list cannot read /etc/passwd by
/// mistake or by design of whoever wrote it.
bool leavesRoot(const std::string& path) {
  if (!path.empty() && path[0] == '/') return true;
  int64_t depth = 0;
  size_t b = 0;
  while (b <= path.size()) {
    size_t e = path.find('/', b);
    if (e == std::string::npos) e = path.size();
    const std::string part = path.substr(b, e - b);
    if (part == "..") {
      if (--depth < 0) return true;
    } else if (!part.empty() && part != ".") {
      ++depth;
    }
    b = e + 1;
  }
  return false;
}

}  // namespace

std::vector<ImageEntry> readImageList(const std::string& list_path, int64_t* classes,
                                      bool outside_root_ok) {
  // Note [input files are regular files]: /dev/zero is one endless line, and a
  // FIFO's open() waited for a writer.
  const InputFile f = openInputFile(list_path);
  if (!f.kind.empty()) {
    throw ConfigError(strCat("data.list: ", list_path, " ", f.why(),
                             "; give a text file of \"relative/path label\" lines"));
  }
  std::ifstream in(list_path, std::ios::binary);
  if (f.fd < 0 || !in) {
    throw ConfigError(strCat("data.list: cannot read ", list_path, ": ",
                             std::strerror(f.fd < 0 ? f.error : errno)));
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
    if (!outside_root_ok && leavesRoot(path)) {
      throw ConfigError(strCat(list_path, ":", lineno, ": '", path, "' leaves the data root (",
                               path[0] == '/' ? "an absolute path" : "'..' above it",
                               "); list paths are relative to data.path (or the list's folder); "
                               "set data.list_outside_root: true to read files outside it"));
    }
    max_label = std::max(max_label, label);
    out.push_back(ImageEntry{path, label, lineno});
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
constexpr char kListMagic[] = "batchdist-image-list 2";

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
  os << "bad " << list.bad.size() << '\n';
  for (const auto& b : list.bad) {
    putString(os, b.path);
    os << ' ';
    putString(os, b.kind);
    os << '\n';
  }
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
  r.literal("bad ");
  const int64_t bad = r.count(6);
  r.ch('\n');
  for (int64_t i = 0; i < bad; ++i) {
    BadEntry b;
    b.path = r.string();
    r.ch(' ');
    b.kind = r.string();
    r.ch('\n');
    list.bad.push_back(std::move(b));
  }
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
  for (const auto& b : list.bad) {  // a dangling link whose target appeared: walk again
    struct stat st;
    if (::stat(absPath(root, b.path).c_str(), &st) == 0 && S_ISREG(st.st_mode)) return false;
  }
  for (const auto& [dir, mtime] : list.dirs) {
    struct stat st;
    if (::stat(absPath(root, dir).c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    if (mtimeNs(st) != mtime) return false;
  }
  return true;
}

}  // namespace batchdist::worker
