#pragma once
// The contract the input pipeline's file readers are fuzzed against, shared by
// the libFuzzer target (tests/fuzz/archive_fuzzer.cc) and the seeded mutation test
// that always runs in ctest (tests/data_fuzz_test.cc): the same bytes go to
// indexTar (through a file), parseNpy and mapNpy, parseImageList and
// readImageList. Each returns or throws batchdist::ConfigError; any other
// exception, a crash or a hang is a bug, and so is a result that breaks its
// invariants: a tar sample whose image lies outside the file or is not where a
// member's data starts, a negative label, a .npy whose shape needs more bytes
// than follow the header, parseNpy and mapNpy disagreeing, an image list that
// does not round-trip or has a label outside its classes.

#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <typeinfo>
#include <vector>

#include "common/error.h"
#include "worker/data/sources/image_folder.h"
#include "worker/data/sources/npy.h"
#include "worker/data/sources/tar_index.h"

namespace batchdist::fuzz {

/// What the readers made of one input (for counting, and for checks that need
/// more than the input, e.g. decoding the tar's images).
struct ArchiveOutcome {
  bool tar = false, npy = false, image_list = false, list_file = false;
  worker::TarShard shard;
};

namespace archive_detail {

/// Runs f; "" when it returned or threw ConfigError (*accepted says which),
/// otherwise what it threw.
template <typename F>
std::string contract(const char* what, bool* accepted, F&& f) {
  *accepted = false;
  try {
    std::string problem = f();
    if (!problem.empty()) return std::string(what) + ": " + problem;
    *accepted = true;
  } catch (const ConfigError&) {
  } catch (const std::exception& e) {
    return std::string(what) + " threw " + typeid(e).name() + " (not ConfigError): " + e.what();
  } catch (...) {
    return std::string(what) + " threw a non-std exception";
  }
  return "";
}

/// Rewrites the file at `path` to hold exactly `data`. Not O_TRUNC: ext4 flushes
/// a file truncated to zero and rewritten when it is closed (auto_da_alloc), which
/// made every input wait for the disk; overwriting then cutting to size does not.
inline bool writeWhole(const std::string& path, const uint8_t* data, std::size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::size_t done = 0;
  while (done < size) {
    const ssize_t w = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (w <= 0) {
      ::close(fd);
      return false;
    }
    done += static_cast<std::size_t>(w);
  }
  const bool ok = ::ftruncate(fd, static_cast<off_t>(size)) == 0;
  return ::close(fd) == 0 && ok;
}

}  // namespace archive_detail

/// "" when every reader kept its contract on `data`, otherwise the first
/// violation. `temp_path`: an existing file the bytes are written to (indexTar,
/// mapNpy and readImageList read files).
inline std::string checkArchive(const uint8_t* data, std::size_t size, const std::string& temp_path,
                                ArchiveOutcome* outcome) {
  using namespace worker;
  using archive_detail::contract;
  *outcome = ArchiveOutcome();
  if (!archive_detail::writeWhole(temp_path, data, size)) return "cannot write " + temp_path;
  const int64_t file_size = static_cast<int64_t>(size);

  auto problem = contract("indexTar", &outcome->tar, [&]() -> std::string {
    outcome->shard = indexTar(temp_path);
    int64_t last_end = 0;
    for (const auto& t : outcome->shard.samples) {
      if (t.image_offset < 512 || t.image_offset % 512 != 0 || t.image_size < 0 ||
          t.image_offset + t.image_size > file_size) {
        return strCat("sample '", t.key, "': image at ", t.image_offset, " + ", t.image_size,
                      " is not member data inside the ", file_size, "-byte file");
      }
      if (t.image_offset < last_end) return strCat("sample '", t.key, "': images overlap");
      last_end = t.image_offset + t.image_size;
      if (t.label < 0) return strCat("sample '", t.key, "': negative label ", t.label);
      if (t.key.empty()) return "a sample with an empty key";
    }
    if (outcome->shard.skipped_members < 0) return "a negative skipped count";
    return "";
  });
  if (!problem.empty()) return problem;

  const std::vector<NpyType> every = {NpyType::kUint8, NpyType::kFloat16, NpyType::kFloat32,
                                      NpyType::kInt32, NpyType::kInt64};
  NpyArray parsed;
  problem = contract("parseNpy", &outcome->npy, [&]() -> std::string {
    parsed = parseNpy(data, size, "fuzz.npy", every);
    if (parsed.shape.empty()) return "an empty shape";
    if (parsed.data < data || parsed.data > data + size) return "data pointer outside the buffer";
    bool zero = false;
    for (int64_t d : parsed.shape) {
      if (d < 0) return "a negative dimension";
      zero = zero || d == 0;
    }
    if (!zero) {
      const uint64_t rows = static_cast<uint64_t>(parsed.shape[0]);
      const uint64_t avail = static_cast<uint64_t>(data + size - parsed.data);
      const uint64_t row = static_cast<uint64_t>(parsed.rowBytes());
      if (row == 0 || rows > avail / row) return "the shape is larger than the data";
    }
    return "";
  });
  if (!problem.empty()) return problem;
  // The reader the npy source really calls: the same verdict from the file.
  bool mapped = false;
  problem = contract("mapNpy", &mapped, [&]() -> std::string {
    const NpyArray m = mapNpy(temp_path, every);
    if (!outcome->npy) return "accepted what parseNpy refused";
    if (m.shape != parsed.shape || m.type != parsed.type ||
        (m.data - static_cast<const uint8_t*>(m.mapping.get())) != (parsed.data - data)) {
      return "a different array than parseNpy";
    }
    return "";
  });
  if (!problem.empty()) return problem;
  if (outcome->npy && !mapped) return "mapNpy refused what parseNpy accepted";
  // A narrower dtype list (the labels' y.npy): never a type outside it.
  bool labels_ok = false;
  problem = contract("parseNpy(labels)", &labels_ok, [&]() -> std::string {
    const NpyArray a = parseNpy(data, size, "fuzz_y.npy", {NpyType::kInt32, NpyType::kInt64});
    if (a.type != NpyType::kInt32 && a.type != NpyType::kInt64) return "a dtype not allowed";
    return "";
  });
  if (!problem.empty()) return problem;

  const std::string text(reinterpret_cast<const char*>(data), size);
  problem = contract("parseImageList", &outcome->image_list, [&]() -> std::string {
    const ImageList list = parseImageList(text, "fuzz.cache");
    const ImageList again = parseImageList(serializeImageList(list), "again");
    if (again.train.size() != list.train.size() || again.val.size() != list.val.size() ||
        again.classes != list.classes || again.dirs != list.dirs ||
        again.has_val != list.has_val || again.skipped != list.skipped ||
        again.bad.size() != list.bad.size()) {
      return "no round trip";
    }
    for (const auto* part : {&list.train, &list.val}) {
      for (const auto& e : *part) {
        if (e.label < 0 || e.label >= static_cast<int64_t>(list.classes.size()))
          return strCat("label ", e.label, " outside ", list.classes.size(), " classes");
      }
    }
    if (!list.has_val && !list.val.empty()) return "val entries without has_val";
    return "";
  });
  if (!problem.empty()) return problem;

  problem = contract("readImageList", &outcome->list_file, [&]() -> std::string {
    int64_t classes = 0;
    const auto entries = readImageList(temp_path, &classes);
    if (entries.empty()) return "no entries, no error";
    for (const auto& e : entries) {
      if (e.label < 0 || e.label >= classes)
        return strCat("label ", e.label, " outside ", classes, " classes");
    }
    return "";
  });
  return problem;
}

}  // namespace batchdist::fuzz
