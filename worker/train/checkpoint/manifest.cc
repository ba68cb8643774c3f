#include "worker/train/checkpoint/manifest.h"

#include <cstdio>

#include "common/error.h"
#include "worker/common/util.h"
#include "worker/plan/plan.h"
#include "worker/config/config.h"

namespace batchdist::worker {

// Note [manifest formats]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Format 5: under dist.shard: optimizer, optimizer_state.bin and the manifest's
// "optimizer_state" instead of optimizer.pt (Note [sharded checkpoint]).
// Format 4: the adaptive record's throughput, segments, history and noise entries
// keyed (worker/train/adapt/adapt_record.h); formats 2 and 3's positional ones are still
// read. Format 3: the history's epochs as keyed objects with the task's metrics
// (Note [task]); format 2's positional [epoch, train_loss, eval_loss,
// eval_accuracy, samples_per_s, seconds] is still read. Format 2: rng.pt as
// generator records (Note [rng records]) and the manifest's "rng"; format 1 (a
// torch archive of CPU generators) is still read.
// Without a format of their own: "levers" (absent before Note [lever search]: none
// and off), an epoch's "noise_scale" (absent: not measured), and "adapt",
// "optimizer_state" and "loss_scaler", present only when the run had them.
// readManifest is the one place that knows these; the adapt record's own formats
// are adapt_record's (it stays opaque here).

uint64_t fnv1a64(const void* data, std::size_t n, uint64_t hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    hash ^= p[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

std::string hashHex(uint64_t hash) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(hash));
  return buf;
}

std::string fnv1a64Hex(const std::string& bytes) {
  return hashHex(fnv1a64(bytes.data(), bytes.size()));
}

std::string manifestChecksum(nlohmann::ordered_json m) {
  m.erase("checksum");
  return fnv1a64Hex(m.dump());
}

ManifestPlan manifestPlan(const Plan& p) {
  return {p.global, p.per_gpu, p.accum, p.world_size, p.steps_per_epoch, p.total_steps,
          p.dataset_size};
}

namespace {

using Json = nlohmann::ordered_json;

Json historyJson(const std::vector<EpochStats>& history) {
  auto out = Json::array();
  for (const auto& h : history) {
    auto metrics = Json::object();
    for (const auto& x : h.eval_metrics) metrics[x.name] = x.value;
    out.push_back({{"epoch", h.epoch},
                   {"train_loss", h.train_loss},
                   {"eval_loss", h.eval_loss},
                   {"eval", metrics},
                   {"samples_per_s", h.samples_per_s},
                   {"seconds", h.seconds},
                   {"noise_scale", h.noise_scale}});
  }
  return out;
}

Json manifestPlanJson(const ManifestPlan& p) {
  return {{"global", p.global}, {"per_gpu", p.per_gpu}, {"accum", p.accum},
          {"world_size", p.world_size}, {"steps_per_epoch", p.steps_per_epoch},
          {"total_steps", p.total_steps}, {"dataset_size", p.dataset_size}};
}

Json rngJson(const RngLayout& l) {
  return {{"layout", "records"}, {"ranks", l.ranks}, {"cpu", l.cpu_bytes > 0},
          {"cuda", l.cuda_bytes > 0}, {"cpu_bytes", l.cpu_bytes}, {"cuda_bytes", l.cuda_bytes},
          {"record_bytes", l.record()}, {"chunk_ranks", l.chunk_ranks}};
}

Json flatStateJson(const FlatStateEntry& s) {
  return {{"layout", "flat"}, {"names", s.names}, {"params", s.params},
          {"elements", s.elements}, {"dtype", s.dtype}, {"element_bytes", s.element_bytes},
          {"ranks", s.ranks}, {"chunk_bytes", s.chunk_bytes}, {"file", s.file}};
}

Json filesJson(const std::vector<ManifestFile>& files) {
  auto out = Json::array();
  for (const auto& f : files) {
    out.push_back({{"name", f.name}, {"bytes", f.bytes}, {"fnv1a64", f.fnv1a64}});
  }
  return out;
}

}  // namespace

nlohmann::ordered_json manifestJson(const CheckpointManifest& m) {
  Json j{{"format", m.format},
         {"batchdist_version", m.batchdist_version},
         {"torch_version", m.torch_version},
         {"created_unix", m.created_unix},
         {"step", m.step},
         {"epoch", m.epoch},
         {"step_in_epoch", m.step_in_epoch},
         {"lr_next", m.lr_next},
         {"samples", m.samples},
         {"epoch_samples", m.epoch_samples},
         {"epoch_loss_sum", m.epoch_loss_sum},
         {"history", historyJson(m.history)},
         {"plan", manifestPlanJson(m.plan)},
         {"searched_per_gpu", m.searched_per_gpu},
         {"levers", leversJson(m.levers)},
         {"config_hash", m.config_hash},
         {"config", m.config},
         {"parameters", m.parameters},
         {"buffers", m.buffers}};
  if (m.rng) j["rng"] = rngJson(*m.rng);
  if (!m.adapt.is_null()) j["adapt"] = m.adapt;
  if (m.optimizer_state) j["optimizer_state"] = flatStateJson(*m.optimizer_state);
  if (m.loss_scaler) {
    j["loss_scaler"] = {{"scale", m.loss_scaler->scale},
                        {"tracker", m.loss_scaler->tracker},
                        {"skipped", m.loss_scaler->skipped}};
  }
  j["files"] = filesJson(m.files);
  j["checksum"] = manifestChecksum(j);
  return j;
}

namespace {

/// One object of the manifest, read key by key: a missing key or a value of
/// another type is an Error naming it ("plan.world_size", "history[2].eval").
class Fields {
 public:
  Fields(const Json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j_.is_object()) throw Error(strCat("manifest.json: ", name(""), " is not an object"));
  }
  bool has(const char* key) const { return j_.contains(key); }
  const Json& at(const char* key) const {
    const auto it = j_.find(key);
    if (it == j_.end()) {
      throw Error(strCat("manifest.json has no \"", name(key),
                         "\" (written by another batchdist, or edited after its checksum was "
                         "computed?); resume from another checkpoint or start fresh"));
    }
    return *it;
  }
  template <typename T>
  T get(const char* key) const {
    const Json& v = at(key);
    try {
      return v.get<T>();
    } catch (const nlohmann::json::exception& e) {
      throw Error(strCat("manifest.json: \"", name(key), "\" is ", v.dump(), ", not the ",
                         "value this batchdist reads (", e.what(), ")"));
    }
  }
  Fields object(const char* key) const { return Fields(at(key), name(key)); }
  std::string name(const std::string& key) const {
    return where_.empty() ? key : key.empty() ? where_ : strCat(where_, ".", key);
  }

 private:
  const Json& j_;
  std::string where_;
};

/// Formats 1 and 2: [epoch, train_loss, eval_loss, eval_accuracy, samples_per_s,
/// seconds], classification's accuracy, no noise scale.
EpochStats positionalEpoch(const Json& h, const std::string& where) {
  if (h.size() < 6) {
    throw Error(strCat("manifest.json: \"", where, "\" has ", h.size(),
                       " values, an epoch of formats 1 and 2 has 6"));
  }
  EpochStats e;
  try {
    e.epoch = h[0].get<int64_t>();
    e.train_loss = h[1].get<double>();
    e.eval_loss = h[2].get<double>();
    e.eval_metrics = {{"accuracy", h[3].get<double>()}};
    e.samples_per_s = h[4].get<double>();
    e.seconds = h[5].get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(strCat("manifest.json: \"", where, "\" is ", h.dump(), " (", e.what(), ")"));
  }
  return e;
}

EpochStats keyedEpoch(const Fields& h) {
  EpochStats e;
  e.epoch = h.get<int64_t>("epoch");
  e.train_loss = h.get<double>("train_loss");
  e.eval_loss = h.get<double>("eval_loss");
  const Fields eval = h.object("eval");
  for (const auto& [name, v] : h.at("eval").items()) {
    e.eval_metrics.push_back({name, eval.get<double>(name.c_str())});
  }
  e.samples_per_s = h.get<double>("samples_per_s");
  e.seconds = h.get<double>("seconds");
  if (h.has("noise_scale")) e.noise_scale = h.get<double>("noise_scale");
  return e;
}

std::vector<EpochStats> readHistory(const Fields& m) {
  const Json& list = m.at("history");
  if (!list.is_array()) throw Error("manifest.json: \"history\" is not a list");
  std::vector<EpochStats> out;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string where = strCat("history[", i, "]");
    out.push_back(list[i].is_array() ? positionalEpoch(list[i], where)
                                     : keyedEpoch(Fields(list[i], where)));
  }
  return out;
}

ManifestPlan readPlan(const Fields& p) {
  ManifestPlan out;
  out.global = p.get<int64_t>("global");
  out.per_gpu = p.get<int64_t>("per_gpu");
  out.accum = p.get<int64_t>("accum");
  out.world_size = p.get<int64_t>("world_size");
  out.steps_per_epoch = p.get<int64_t>("steps_per_epoch");
  out.total_steps = p.get<int64_t>("total_steps");
  out.dataset_size = p.get<int64_t>("dataset_size");
  return out;
}

/// Note [lever search]; a manifest from before the levers were recorded: none and off.
Levers readLevers(const Fields& m) {
  Levers l;
  if (!m.has("levers")) return l;
  const Fields j = m.object("levers");
  const auto shard = parseEnum<Shard>(j.get<std::string>("shard"));
  const auto recompute = parseEnum<Recompute>(j.get<std::string>("recompute"));
  if (!shard || *shard == Shard::kAuto) {
    throw Error(strCat("manifest.json: \"levers.shard\" is ", j.at("shard").dump(),
                       ", not a lever this batchdist knows"));
  }
  if (!recompute || *recompute == Recompute::kAuto) {
    throw Error(strCat("manifest.json: \"levers.recompute\" is ", j.at("recompute").dump(),
                       ", not a lever this batchdist knows"));
  }
  return {*shard, *recompute};
}

/// Format 2 on: the generator records (Note [rng records]); format 1: none.
std::optional<RngLayout> readRng(const Fields& m, int format) {
  if (format < 2) return std::nullopt;
  const Fields r = m.object("rng");
  if (r.get<std::string>("layout") != "records") {
    throw Error(strCat("manifest.json: \"rng.layout\" is ", r.at("layout").dump(),
                       ", not \"records\""));
  }
  RngLayout l;
  l.ranks = r.get<int64_t>("ranks");
  l.cpu_bytes = r.get<int64_t>("cpu_bytes");
  l.cuda_bytes = r.get<int64_t>("cuda_bytes");
  l.chunk_ranks = r.get<int64_t>("chunk_ranks");
  if (r.get<int64_t>("record_bytes") != l.record()) {
    throw Error(strCat("manifest.json: \"rng.record_bytes\" is ", r.at("record_bytes").dump(),
                       ", but cpu_bytes and cuda_bytes make records of ", l.record()));
  }
  return l;
}

FlatStateEntry readFlatState(const Fields& s) {
  if (s.get<std::string>("layout") != "flat") {
    throw Error(strCat("manifest.json: \"optimizer_state.layout\" is ", s.at("layout").dump(),
                       ", not \"flat\""));
  }
  FlatStateEntry e;
  e.names = s.get<std::vector<std::string>>("names");
  e.params = s.get<int64_t>("params");
  e.elements = s.get<int64_t>("elements");
  e.dtype = s.get<std::string>("dtype");
  e.element_bytes = s.get<int64_t>("element_bytes");
  e.ranks = s.get<int64_t>("ranks");
  e.chunk_bytes = s.get<int64_t>("chunk_bytes");
  e.file = s.get<std::string>("file");
  return e;
}

std::vector<ManifestFile> readFiles(const Fields& m) {
  const Json& list = m.at("files");
  if (!list.is_array()) throw Error("manifest.json: \"files\" is not a list");
  std::vector<ManifestFile> out;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const Fields f(list[i], strCat("files[", i, "]"));
    out.push_back({f.get<std::string>("name"), f.get<uint64_t>("bytes"),
                   f.get<std::string>("fnv1a64")});
  }
  return out;
}

/// The identity and the position: the keys every format has.
void readCommon(const Fields& f, CheckpointManifest& m) {
  m.batchdist_version = f.get<std::string>("batchdist_version");
  m.torch_version = f.get<std::string>("torch_version");
  m.created_unix = f.get<int64_t>("created_unix");
  m.step = f.get<int64_t>("step");
  m.epoch = f.get<int64_t>("epoch");
  m.step_in_epoch = f.get<int64_t>("step_in_epoch");
  m.lr_next = f.get<double>("lr_next");
  m.samples = f.get<int64_t>("samples");
  m.epoch_samples = f.get<int64_t>("epoch_samples");
  m.epoch_loss_sum = f.get<double>("epoch_loss_sum");
  m.history = readHistory(f);
  m.plan = readPlan(f.object("plan"));
  m.searched_per_gpu = f.get<int64_t>("searched_per_gpu");
  m.config_hash = f.get<std::string>("config_hash");
  m.config = f.at("config");
  m.parameters = f.get<std::vector<std::string>>("parameters");
  m.buffers = f.get<std::vector<std::string>>("buffers");
}

}  // namespace

CheckpointManifest readManifest(const nlohmann::ordered_json& j) {
  const Fields f(j, "");
  CheckpointManifest m;
  m.format = f.get<int>("format");
  if (m.format < kOldestManifestFormat || m.format > kManifestFormat) {
    throw Error(strCat("format ", m.format, ", this batchdist reads formats ",
                       kOldestManifestFormat, " to ", kManifestFormat));
  }
  readCommon(f, m);
  m.levers = readLevers(f);
  m.rng = readRng(f, m.format);
  if (f.has("adapt")) m.adapt = f.at("adapt");
  if (f.has("optimizer_state")) m.optimizer_state = readFlatState(f.object("optimizer_state"));
  if (f.has("loss_scaler")) {
    const Fields s = f.object("loss_scaler");
    m.loss_scaler = ScalerEntry{s.get<double>("scale"), s.get<int64_t>("tracker"),
                                s.get<int64_t>("skipped")};
  }
  m.files = readFiles(f);
  return m;
}

TrainPosition positionOf(const CheckpointManifest& m) {
  TrainPosition p;
  p.global_step = m.step;
  p.samples = m.samples;
  p.epoch_samples = m.epoch_samples;
  p.epoch_loss_sum = m.epoch_loss_sum;
  p.history = m.history;
  p.adapt = m.adapt;
  return p;
}

}  // namespace batchdist::worker
