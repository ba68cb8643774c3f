// libFuzzer target for the input pipeline's file readers (see tests/fuzz/README.md):
// the same bytes go to indexTar (through a temp file), parseNpy, parseImageList
// and readImageList. Each must return or throw batchdist::ConfigError; any other
// exception, a crash, a sanitizer report, a hang or a huge allocation is a bug.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "collective/error.h"
#include "worker/data/sources/image_folder.h"
#include "worker/data/sources/npy.h"
#include "worker/data/sources/tar_index.h"

namespace {

using namespace batchdist::worker;

/// One temp file per process, rewritten for every input.
const std::string& tempPath() {
  static const std::string path = [] {
    std::string tmpl = "/tmp/batchdist_archive_fuzz_XXXXXX";
    const int fd = ::mkstemp(tmpl.data());
    if (fd < 0) std::abort();
    ::close(fd);
    std::atexit([] { ::unlink(tempPath().c_str()); });
    return tmpl;
  }();
  return path;
}

void writeTemp(const uint8_t* data, size_t size) {
  const int fd = ::open(tempPath().c_str(), O_WRONLY | O_TRUNC);
  if (fd < 0) std::abort();
  size_t done = 0;
  while (done < size) {
    const ssize_t w = ::write(fd, data + done, size - done);
    if (w <= 0) std::abort();
    done += static_cast<size_t>(w);
  }
  ::close(fd);
}

template <typename F>
void contract(const char* what, F&& f) {
  try {
    f();
  } catch (const batchdist::ConfigError&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s threw a non-ConfigError: %s\n", what, e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "%s threw a non-std exception\n", what);
    std::abort();
  }
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant broken: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  writeTemp(data, size);
  contract("indexTar", [&] {
    const TarShard s = indexTar(tempPath());
    for (const auto& t : s.samples) {
      check(t.image_offset >= 512 && t.image_size >= 0 &&
                static_cast<uint64_t>(t.image_offset) + static_cast<uint64_t>(t.image_size) <= size,
            "indexTar: an image range outside the file");
      check(t.label >= 0, "indexTar: a negative label");
    }
  });
  contract("parseNpy", [&] {
    const NpyArray a = parseNpy(data, size, "fuzz.npy",
                                {NpyType::kUint8, NpyType::kFloat16, NpyType::kFloat32,
                                 NpyType::kInt32, NpyType::kInt64});
    check(!a.shape.empty() && a.data >= data && a.data <= data + size, "parseNpy: data outside");
    bool zero = false;
    for (int64_t d : a.shape) zero = zero || d == 0;
    if (!zero) {
      const uint64_t rows = static_cast<uint64_t>(a.shape[0]);
      check(rows * static_cast<uint64_t>(a.rowBytes()) <= static_cast<uint64_t>(data + size - a.data),
            "parseNpy: the shape is larger than the data");
    }
  });
  const std::string text(reinterpret_cast<const char*>(data), size);
  contract("parseImageList", [&] {
    const ImageList list = parseImageList(text, "fuzz.cache");
    check(parseImageList(serializeImageList(list), "again").train.size() == list.train.size(),
          "parseImageList: no round trip");
    for (const auto& e : list.train)
      check(e.label >= 0 && e.label < static_cast<int64_t>(list.classes.size()), "label range");
  });
  contract("readImageList", [&] {
    int64_t classes = 0;
    const auto entries = readImageList(tempPath(), &classes);
    for (const auto& e : entries) check(e.label >= 0 && e.label < classes, "list label range");
  });
  return 0;
}
