#include "worker/config/config.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>

#include "common/error.h"
#include "worker/common/console.h"
#include "worker/common/files.h"

namespace batchdist::worker {

ConfigError keyError(const std::string& source, const std::string& key, const std::string& what) {
  return ConfigError(strCat(source, ": ", key, ": ", what));
}

std::string setName(SetsFrom from, const std::string& path) {
  return from == SetsFrom::kSettings ? strCat("Settings::set(\"", path, "\")") : "--set " + path;
}

const std::vector<std::string>& Config::perRankKeys() {
  static const std::vector<std::string> keys = {"search.memory_limit_mb", "dist.interface",
                                                "train.threads", "search.cache"};
  return keys;
}

// Note [task choice]: token windows are read by a gpt, trained by the language-model
// task, or by a TorchScript module with its own loss (task module_loss; whether its
// forward takes the target is seen once the file is loaded: chooseTask); each
// without the others is refused, naming both keys.
std::optional<KeyProblem> languageModelMismatch(const Config& cfg) {
  const bool tokens = cfg.data.name == DataName::kTokens;
  const bool gpt = cfg.model.name == ModelName::kGpt;
  // A module with its own loss: a TorchScript file's, or a program's (Note [program parts]).
  const bool script = cfg.model.name == ModelName::kTorchscript ||
                      cfg.model.name == ModelName::kProgram;
  const TaskKind task = cfg.task.name;
  const char* const token_data = "data.name: tokens (a .bin or .npy of token ids: docs/data.md)";
  if (task == TaskKind::kLanguageModel && !tokens) {
    return KeyProblem{"task.name", strCat("language_model trains on token windows, but data.name "
                                          "is ", toString(cfg.data.name), "; use ", token_data)};
  }
  if (tokens && task != TaskKind::kAuto && task != TaskKind::kLanguageModel &&
      !(script && task == TaskKind::kModuleLoss)) {
    return KeyProblem{"task.name", strCat(toString(task), " does not fit data.name: tokens, whose "
                                          "targets are the next tokens; use task.name: "
                                          "language_model (or auto)")};
  }
  if (tokens && script && task == TaskKind::kLanguageModel) {
    return KeyProblem{"task.name", "language_model trains model.name: gpt; a TorchScript module "
                                   "trains on token windows with its own loss: use task.name: "
                                   "module_loss (or auto), its forward(x, target) returning one "
                                   "loss per window (docs/models.md)"};
  }
  if (tokens && !gpt && !script) {
    return KeyProblem{"model.name", strCat(toString(cfg.model.name), ", but data.name: tokens "
                                           "gives token ids, which only model.name: gpt reads "
                                           "(or a TorchScript module with its own loss: "
                                           "docs/models.md); use model.name: gpt")};
  }
  if (gpt && !tokens) {
    return KeyProblem{"data.name", strCat(toString(cfg.data.name), ", but model.name: gpt reads "
                                          "token ids and trains as a language model; use ",
                                          token_data)};
  }
  return std::nullopt;
}

std::size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

/// State shared by all sections while one config is read.
struct Context {
  std::string source;
  SetsFrom sets_from = SetsFrom::kCommandLine;
  std::set<std::string> from_set;  // paths given by --set ("batch.global")
  std::set<std::string> sections_from_set;  // sections only --set mentions
  std::vector<std::string> known;  // every key the schema asked for, full path
  struct Unknown {
    std::string path;
    YAML::Mark mark;
  };
  std::vector<Unknown> unknown;
  nlohmann::ordered_json* resolved = nullptr;

  /// "file.yaml:12: batch.global", or "--set batch.global" (setName).
  std::string where(const std::string& path, const YAML::Mark& mark) const {
    if (from_set.count(path) || sections_from_set.count(path)) return setName(sets_from, path);
    if (mark.line >= 0) return strCat(source, ":", mark.line + 1, ": ", path);
    return strCat(source, ": ", path);
  }

  /// keyError's message, from the file or from the override that set `key`.
  ConfigError error(const std::string& key, const std::string& what) const {
    if (from_set.count(key)) return ConfigError(strCat(setName(sets_from, key), ": ", what));
    return keyError(source, key, what);
  }
};

// Note [one YAML document]: yaml-cpp 0.7's LoadAll never returns on some
// malformed input: a token no rule consumes, such as the stray ',' in "- a\n,",
// yields one more empty document per call until memory runs out
// (jbeder/yaml-cpp#1040, fixed after 0.8.0), and Load ignores what follows the
// first document ("[1], 2" loads as [1]). So the documents are walked through
// the public event interface, a document that starts where the previous one
// did is a syntax error, and only then is the single document loaded.
class DocumentStarts final : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> marks;
  void OnDocumentStart(const YAML::Mark& mark) override { marks.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

/// The start of every document in `text`. Throws YAML::ParserException for
/// malformed YAML, including text that belongs to no document.
std::vector<YAML::Mark> documentStarts(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts starts;
  while (parser.HandleNextDocument(starts)) {
    const auto& m = starts.marks;
    if (m.size() >= 2 && m[m.size() - 1].pos == m[m.size() - 2].pos) {
      throw YAML::ParserException(m.back(), "unexpected text after the end of the document (a "
                                            "stray ',' outside [ ] or { }?)");
    }
  }
  return starts.marks;
}

/// Offset of the first byte of `s` that does not belong to well-formed UTF-8
/// (Unicode Table 3-7: no overlongs, surrogates or code points past U+10FFFF),
/// or npos. yaml-cpp passes stray bytes through; the resolved config (report,
/// cross-rank check, search cache key) is JSON, which must be UTF-8.
std::size_t invalidUtf8At(const std::string& s) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = byte(i);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + len > s.size()) return i;
    if (byte(i + 1) < lo || byte(i + 1) > hi) return i;
    for (std::size_t k = 2; k < len; ++k) {
      if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return i;
    }
    i += len;
  }
  return std::string::npos;
}

std::string scalarText(const YAML::Node& n) {
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  return "nothing";
}

/// The keys of mapping `map` (at `path`, "" for the top level) as plain names.
/// Refuses keys that are not plain scalars (`? [a, b] : 1`) and keys given twice,
/// which YAML forbids and yaml-cpp would silently resolve to the first.
std::vector<std::pair<std::string, YAML::Mark>> mapKeys(const Context& ctx, const YAML::Node& map,
                                                        const std::string& path) {
  std::vector<std::pair<std::string, YAML::Mark>> keys;
  for (const auto& kv : map) {
    const std::string here = path.empty() ? "top level" : path;
    if (!kv.first.IsScalar()) {
      throw ConfigError(strCat(ctx.where(path, kv.first.Mark()), path.empty() ? "" : ": ",
                               "a key must be a plain name, got ", scalarText(kv.first), " (in ",
                               here, ")"));
    }
    const std::string key = kv.first.Scalar();
    for (const auto& [seen, mark] : keys) {
      if (seen == key) {
        const std::string full = path.empty() ? key : path + "." + key;
        throw ConfigError(strCat(ctx.where(full, kv.first.Mark()), ": '", key,
                                 "' is given twice (first on line ", mark.line + 1,
                                 "); keep one"));
      }
    }
    keys.emplace_back(key, kv.first.Mark());
  }
  return keys;
}

/// Reads one mapping of the config, recording every key it knows.
class Section {
 public:
  Section(Context& ctx, const YAML::Node& root, std::string name)
      : ctx_(ctx), name_(std::move(name)) {
    // const operator[] yields an invalid node for a missing key; assign only real ones.
    if (root.IsMap() && root[name_]) node_ = root[name_];
    if (node_ && !node_.IsMap() && !node_.IsNull()) {
      throw ConfigError(strCat(ctx_.where(name_, node_.Mark()), ": expected a mapping of keys, got ",
                               scalarText(node_)));
    }
    if (node_ && node_.IsMap()) present_ = mapKeys(ctx_, node_, name_);
    (*ctx_.resolved)[name_] = nlohmann::ordered_json::object();
  }

  ~Section() noexcept(false) {
    if (std::uncaught_exceptions() > 0) return;
    for (const auto& [key, mark] : present_) {
      if (std::find(keys_.begin(), keys_.end(), key) == keys_.end()) {
        ctx_.unknown.push_back({name_ + "." + key, mark});
      }
    }
  }

  int64_t integer(const std::string& key, int64_t def, int64_t lo, int64_t hi) {
    const auto n = get(key);
    int64_t v = def;
    if (n) v = asInt(n, key);
    checkRange(key, n, v, lo, hi);
    record(key, v);
    return v;
  }

  double real(const std::string& key, double def, double lo, double hi) {
    const auto n = get(key);
    double v = def;
    if (n) {
      try {
        v = n.as<double>();
      } catch (const YAML::Exception&) {
        throw typeError(key, n, "a number");
      }
      if (!std::isfinite(v)) throw typeError(key, n, "a finite number");
    }
    if (v < lo || v > hi) {
      throw ConfigError(strCat(where(key, n), ": ", v, " is out of range; allowed ", lo, " .. ", hi));
    }
    record(key, v);
    return v;
  }

  bool boolean(const std::string& key, bool def) {
    const auto n = get(key);
    bool v = def;
    if (n) {
      try {
        v = n.as<bool>();
      } catch (const YAML::Exception&) {
        throw typeError(key, n, "true or false");
      }
    }
    record(key, v);
    return v;
  }

  std::string text(const std::string& key, const std::string& def) {
    const auto n = get(key);
    std::string v = def;
    if (n) {
      if (!n.IsScalar()) throw typeError(key, n, "a string");
      v = n.Scalar();
      if (const auto at = invalidUtf8At(v); at != std::string::npos) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned char>(v[at]));
        throw ConfigError(strCat(where(key, n), ": is not valid UTF-8 (byte ", hex, " at offset ",
                                 at, " of the value); YAML text must be UTF-8 (was it saved "
                                 "as Latin-1?)"));
      }
    }
    record(key, v);
    return v;
  }

  /// One name of the closed set E (EnumNames<E>).
  template <typename E>
  E choice(const std::string& key, E def) {
    const auto n = get(key);
    std::vector<std::string> allowed;
    for (const auto& [e, name] : EnumNames<E>::kNames) allowed.emplace_back(name);
    E v = def;
    if (n) {
      if (!n.IsScalar()) throw typeError(key, n, "one of " + joined(allowed));
      const auto parsed = parseEnum<E>(n.Scalar());
      if (!parsed) {
        std::string hint;
        for (const auto& a : allowed) {
          if (editDistance(a, n.Scalar()) <= 2) hint = "; did you mean '" + a + "'?";
        }
        throw ConfigError(strCat(where(key, n), ": '", n.Scalar(), "' is not one of ",
                                 joined(allowed), hint));
      }
      v = *parsed;
    }
    record(key, toString(v));
    return v;
  }

  std::vector<int64_t> intList(const std::string& key, const std::vector<int64_t>& def, int64_t lo,
                               int64_t hi) {
    const auto n = get(key);
    std::vector<int64_t> v = def;
    if (n) {
      if (!n.IsSequence()) throw typeError(key, n, "a list of integers, e.g. [128, 64]");
      v.clear();
      for (const auto& item : n) {
        v.push_back(asInt(item, key));
        checkRange(key, item, v.back(), lo, hi);
      }
    }
    record(key, v);
    return v;
  }

  std::vector<double> realList(const std::string& key, const std::vector<double>& def, double lo,
                               double hi) {
    const auto n = get(key);
    std::vector<double> v = def;
    if (n) {
      if (!n.IsSequence()) throw typeError(key, n, "a list of numbers, e.g. [0.5, 0.5, 0.5]");
      v.clear();
      for (const auto& item : n) {
        double x = 0;
        try {
          x = item.as<double>();
        } catch (const YAML::Exception&) {
          throw typeError(key, item, "a number");
        }
        if (!std::isfinite(x) || x < lo || x > hi) {
          throw ConfigError(strCat(where(key, item), ": ", x, " is out of range; allowed ", lo,
                                   " .. ", hi));
        }
        v.push_back(x);
      }
    }
    record(key, v);
    return v;
  }

  /// Whether the section gives `key` (in the file or by --set).
  bool has(const std::string& key) const {
    for (const auto& [k, mark] : present_) {
      if (k == key) return true;
    }
    return false;
  }

  /// An integer >= lo, or the word "auto" (returned as `is_auto`), or absent (def).
  int64_t integerOrAuto(const std::string& key, int64_t def, int64_t lo, bool* is_auto) {
    const auto n = get(key);
    *is_auto = false;
    int64_t v = def;
    if (n && n.IsScalar() && n.Scalar() == "auto") {
      *is_auto = true;
      record(key, "auto");
      return 0;
    }
    if (n) {
      try {
        v = n.as<int64_t>();
      } catch (const YAML::Exception&) {
        throw typeError(key, n, "an integer or 'auto'");
      }
      checkRange(key, n, v, lo, kMaxInt);
    }
    if (v == 0) {
      record(key, nullptr);
    } else {
      record(key, v);
    }
    return v;
  }

 private:
  YAML::Node get(const std::string& key) {
    keys_.push_back(key);
    ctx_.known.push_back(name_ + "." + key);
    if (!node_ || !node_.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node& cnode = node_;
    YAML::Node n = cnode[key];
    if (!n || n.IsNull()) return YAML::Node(YAML::NodeType::Undefined);
    return n;
  }

  int64_t asInt(const YAML::Node& n, const std::string& key) {
    try {
      return n.as<int64_t>();
    } catch (const YAML::Exception&) {
      throw typeError(key, n, "an integer");
    }
  }

  void checkRange(const std::string& key, const YAML::Node& n, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo) throw ConfigError(strCat(where(key, n), ": must be >= ", lo, ", got ", v));
    if (v > hi) throw ConfigError(strCat(where(key, n), ": must be <= ", hi, ", got ", v));
  }

  ConfigError typeError(const std::string& key, const YAML::Node& n, const std::string& want) {
    return ConfigError(strCat(where(key, n), ": expected ", want, ", got ", scalarText(n)));
  }

  std::string where(const std::string& key, const YAML::Node& n) const {
    return ctx_.where(name_ + "." + key, n ? n.Mark() : YAML::Mark::null_mark());
  }

  template <typename T>
  void record(const std::string& key, const T& value) {
    (*ctx_.resolved)[name_][key] = value;
  }

  static std::string joined(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : " | ") + x;
    return s;
  }

  Context& ctx_;
  std::string name_;
  YAML::Node node_;
  std::vector<std::string> keys_;
  std::vector<std::pair<std::string, YAML::Mark>> present_;
};

const std::vector<std::string> kSections = {"task", "model",  "data",       "batch", "optim",
                                            "train", "dist", "search", "checkpoint", "report",
                                            "elastic", "profile"};

std::string suggestion(const std::string& path, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = std::max<std::size_t>(2, path.size() / 3) + 1;
  const std::string leaf = path.substr(path.rfind('.') + 1);
  for (const auto& c : candidates) {
    std::size_t d = editDistance(path, c);
    // The right key in the wrong section (train.lr -> optim.lr) is a good guess too.
    if (c.substr(c.rfind('.') + 1) == leaf) d = std::min<std::size_t>(d, 1);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best.empty() ? "" : "; did you mean '" + best + "'?";
}

void applyOverride(YAML::Node& root, const std::string& spec, Context& ctx) {
  const auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0) {
    if (ctx.sets_from == SetsFrom::kSettings) {  // which forms key=value itself: the key is empty
      throw ConfigError(strCat(setName(ctx.sets_from, ""),
                               ": keys have the form section.key (e.g. optim.lr)"));
    }
    throw ConfigError(strCat("--set expects key.path=value (e.g. --set batch.global=128), got '",
                             spec, "'"));
  }
  const std::string path = spec.substr(0, eq);
  const std::string text = spec.substr(eq + 1);
  YAML::Node value;
  try {
    if (text.empty()) {
      value = YAML::Node(std::string());
    } else {
      if (documentStarts(text).size() > 1) {
        throw ConfigError(strCat(setName(ctx.sets_from, path), ": cannot parse value '", text,
                                 "': it holds several YAML documents ('---'); give one value"));
      }
      value = YAML::Load(text);
    }
  } catch (const YAML::Exception& e) {
    throw ConfigError(strCat(setName(ctx.sets_from, path), ": cannot parse value '", text, "': ",
                             e.msg));
  }
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  if (parts.size() != 2 || parts[0].empty() || parts[1].empty()) {
    throw ConfigError(strCat(setName(ctx.sets_from, path),
                             ": keys have the form section.key (e.g. optim.lr)"));
  }
  if (!root.IsMap()) root = YAML::Node(YAML::NodeType::Map);
  if (!root[parts[0]]) ctx.sections_from_set.insert(parts[0]);
  YAML::Node section = root[parts[0]];
  if (section.IsDefined() && !section.IsNull() && !section.IsMap()) {
    throw ConfigError(strCat(setName(ctx.sets_from, path), ": '", parts[0], "' is not a mapping in ",
                             ctx.source));
  }
  section[parts[1]] = value;
  ctx.from_set.insert(path);
}

/// data.name: tokens (Note [tokens]): the pairing with gpt and the task, the
/// file, and no image transform (token ids are neither pixels nor features).
template <typename Err>
void validateTokens(const Config& cfg, const Err& err) {
  if (const auto p = languageModelMismatch(cfg)) throw err(p->key, p->what);
  if (cfg.data.name != DataName::kTokens) return;
  if (cfg.data.path.empty()) {
    throw err("data.path", "data.name: tokens needs the token file: a .bin of little-endian uint16 "
                           "ids (as nanoGPT's prepare.py or `batchdist_make_data tokens` write "
                           "it) or a 1-D .npy of uint16, int32 or int64");
  }
  const std::pair<const char*, bool> image_keys[] = {
      {"data.crop_padding", cfg.data.crop_padding > 0},
      {"data.hflip", cfg.data.hflip},
      {"data.resize", cfg.data.resize > 0},
      {"data.mean", !cfg.data.mean.empty()}};
  for (const auto& [key, given] : image_keys) {
    if (given) {
      throw err(key, "does not apply to data.name: tokens (token ids are not cropped, flipped, "
                     "resized or normalised); remove it");
    }
  }
}

/// The adaptive global batch's rules (batch.adapt: goodput or warmup). Note
/// [goodput] (worker/plan/adapt.h): G0 anchors the efficiency and the learning
/// rate, so it must be a number before the run; the rest (is any G above G0
/// reachable?) needs the world size and the data set: adaptSpace() checks it. Both
/// modes (goodput, Note [batch-size warmup]) start from G0 and re-cut the epoch
/// the same way, so they share every check.
void validateAdapt(const Config& cfg, const Context& ctx) {
  const auto err = [&](const std::string& key, const std::string& what) {
    return ctx.error(key, what);
  };
  const auto& b = cfg.batch;
  if (b.adapt == BatchAdapt::kOff) return;
  const std::string mode = toString(b.adapt);
  if (b.global_auto || (b.global == 0 && (b.per_gpu_auto || b.per_gpu == 0))) {
    throw err("batch.adapt",
              strCat(mode, " starts from batch.global (G0) and adapts from there, but "
                     "batch.global is ", b.global_auto ? "auto" : "not given",
                     "; set batch.global to the starting batch (e.g. 256), or give "
                     "batch.per_gpu as a number so that G0 = per_gpu x accum x world size"));
  }
  if (b.adapt_max > 0 && b.global > 0 && b.adapt_max <= b.global) {
    throw err("batch.adapt_max",
              strCat(b.adapt_max, " is not above batch.global (", b.global,
                     "), the starting batch, so there is nothing to adapt; raise it (0 means "
                     "16 x batch.global = ",
                     b.global > kMaxInt / 16 ? kMaxInt : 16 * b.global, ") or use batch.adapt: off"));
  }
  if (b.last_batch == LastBatch::kKeep) {
    throw err("batch.last_batch",
              strCat("keep cannot be used with batch.adapt: ", mode, ": the short last batch's "
                     "uneven shards are not a split of the global batch (G = per_gpu x accum x "
                     "world size) that the adaptive batch models and re-cuts; use drop or pad"));
  }
  if (!cfg.train.noise_scale) {
    throw err("train.noise_scale",
              strCat("false, but batch.adapt: ", mode, " decides the global batch from the "
                     "gradient noise scale; set train.noise_scale: true, or batch.adapt: off"));
  }
}

/// Rules that tie keys together (each key alone was checked as it was read).
/// Note [parameter units]: what dist.shard: parameters does not take yet, each
/// refused with the key to change.
void validateShardParameters(const Config& cfg, const Context& ctx) {
  for (const auto& [key, set] : {std::pair<const char*, bool>{"dist.reshard_after_forward",
                                                              !cfg.dist.reshard_after_forward},
                                 {"dist.prefetch", !cfg.dist.prefetch}}) {
    if (set && cfg.dist.shard != Shard::kParameters) {
      throw ctx.error(key, "applies to dist.shard: parameters only; remove it");
    }
  }
  if (cfg.dist.shard != Shard::kParameters) return;
  if (const auto no = parametersUnsupported(cfg); !no.key.empty()) {
    throw ctx.error(no.key, strCat(no.why, "; dist.shard: parameters does not take it yet: use "
                                           "dist.shard: gradients"));
  }
}

void validate(const Config& cfg, const Context& ctx) {
  const auto err = [&](const std::string& key, const std::string& what) {
    return ctx.error(key, what);
  };
  const std::string& source = ctx.source;
  if (cfg.optim.min_lr > cfg.optim.lr) {
    throw ConfigError(strCat(source, ": optim.min_lr (", cfg.optim.min_lr,
                             ") must not exceed optim.lr (", cfg.optim.lr, ")"));
  }
  if (cfg.data.mean.size() != cfg.data.std.size()) {
    throw ConfigError(strCat(source, ": data.mean has ", cfg.data.mean.size(),
                             " values but data.std has ", cfg.data.std.size(),
                             "; give one per channel for both"));
  }
  if (cfg.report.sample_s > 0 && cfg.report.sample_s < 0.01) {
    throw err("report.sample_s", strCat(cfg.report.sample_s,
                                        " s is too short a sampling period: 0 (off) or at least 0.01"));
  }
  if (cfg.search.max_steps < cfg.search.timed_steps) {
    throw ConfigError(strCat(source, ": search.max_steps (", cfg.search.max_steps,
                             ") is below search.timed_steps (", cfg.search.timed_steps,
                             "), the minimum number of timed steps per candidate"));
  }
  if (cfg.search.max_time_s < cfg.search.min_time_s) {
    throw ConfigError(strCat(source, ": search.max_time_s (", cfg.search.max_time_s,
                             ") is below search.min_time_s (", cfg.search.min_time_s, ")"));
  }
  if (cfg.search.max != 0 && cfg.search.max < cfg.search.min) {
    throw ConfigError(strCat(source, ": search.max (", cfg.search.max, ") is below search.min (",
                             cfg.search.min, ")"));
  }
  if (cfg.train.memory_format == MemoryFormat::kChannelsLast &&
      (cfg.model.name == ModelName::kMlp || cfg.model.name == ModelName::kGpt ||
       cfg.model.name == ModelName::kProgram)) {
    throw err("train.memory_format", strCat("channels_last is for convolutional models (cnn, "
                                            "resnet18, resnet50, a torchscript module of images), "
                                            "not model.name: ", toString(cfg.model.name),
                                            "; use auto or contiguous"));
  }
  if (cfg.model.flops_per_sample > 0 && cfg.model.name != ModelName::kTorchscript) {
    throw err("model.flops_per_sample", strCat("is for a torchscript module; model.name: ",
                                               toString(cfg.model.name),
                                               " counts its own (Note [mfu]); remove it"));
  }
  if (cfg.model.name == ModelName::kTorchscript && cfg.model.path.empty()) {
    throw err("model.name", "torchscript needs model.path (a module saved with "
                            "torch.jit.script(...).save() or torch.jit.trace)");
  }
  if (cfg.data.list_outside_root && cfg.data.list.empty()) {
    throw err("data.list_outside_root", "applies to data.list only (the paths of a list file); "
                                        "remove it, or give data.list");
  }
  switch (cfg.data.name) {
    case DataName::kCsv:
      if (cfg.data.path.empty()) {
        throw err("data.path", "data.name: csv needs a path to a CSV file (numeric features, "
                               "then an integer label, per line)");
      }
      break;
    case DataName::kCifar10:
    case DataName::kCifar100:
    case DataName::kMnist:
    case DataName::kWebdataset:
    case DataName::kNpy:
      if (cfg.data.path.empty()) {
        throw err("data.path", strCat("data.name: ", toString(cfg.data.name),
                                      " needs the directory holding its files"));
      }
      break;
    case DataName::kImageFolder:
      if (cfg.data.path.empty() && cfg.data.list.empty()) {
        throw err("data.path", "data.name: image_folder needs the folder ROOT holding "
                               "ROOT/train/<class>/... (and optionally ROOT/val/<class>/...)");
      }
      break;
    default: break;
  }
  validateTokens(cfg, err);
  for (const auto& [key, v] : {std::pair<std::string, const std::vector<double>*>{
                                   "data.crop_scale", &cfg.data.crop_scale},
                               {"data.crop_ratio", &cfg.data.crop_ratio}}) {
    if (v->size() != 2 || (*v)[0] > (*v)[1]) {
      throw err(key, strCat("expected [low, high] with low <= high, got ", v->size(),
                            " value(s)", v->size() == 2 ? " in the wrong order" : ""));
    }
  }
  if (cfg.data.decoded() && cfg.data.mean.size() != 3 && !cfg.data.mean.empty()) {
    throw err("data.mean", strCat("image sources decode to 3 channels: give 3 values (or [] for "
                                  "none), got ", cfg.data.mean.size()));
  }
  if (cfg.data.decoded() && cfg.data.resize > 0 && cfg.data.resize < cfg.data.image_size) {
    throw err("data.resize", strCat(cfg.data.resize, " is below data.image_size (",
                                    cfg.data.image_size, "): evaluation resizes the shorter side "
                                    "to data.resize, then centre-crops data.image_size"));
  }
  if (cfg.optim.schedule == Schedule::kStep && cfg.optim.milestones.empty()) {
    throw err("optim.schedule", "step needs optim.milestones (epochs at which the rate is "
                                "multiplied by optim.step_gamma), e.g. [30, 60]");
  }
  if (cfg.optim.name == OptimName::kSgd && cfg.optim.nesterov && cfg.optim.momentum <= 0) {
    throw err("optim.nesterov", "true needs optim.momentum > 0");
  }
  if (cfg.data.name == DataName::kSyntheticImages && cfg.data.shape.size() != 3) {
    throw err("data.shape", strCat("synthetic_images needs [C, H, W], got ", cfg.data.shape.size(),
                                   " dimension(s)"));
  }
  const auto& b = cfg.batch;
  if (b.per_gpu_auto && b.global > 0 && b.accum > 0) {
    throw err("batch.per_gpu",
              strCat("auto with both batch.global (", b.global, ") and batch.accum (", b.accum,
                     ") set leaves nothing to search: per-GPU batch = global / (accum x world "
                     "size). Drop batch.accum to let the search pick the per-GPU batch and "
                     "derive accumulation, or set batch.per_gpu to a number"));
  }
  // Note [equal shards]: BatchNorm needs two samples per micro-batch. Built-in
  // models are known here; a TorchScript model's BatchNorm is checked by the plan.
  const bool builtin_bn = cfg.model.name == ModelName::kResnet18 ||
                          cfg.model.name == ModelName::kResnet50 ||
                          ((cfg.model.name == ModelName::kMlp || cfg.model.name == ModelName::kCnn) &&
                           cfg.model.batchnorm);
  if (builtin_bn && b.min_per_gpu < 2) {
    throw err("batch.min_per_gpu",
              strCat(b.min_per_gpu, " is too small for a model with BatchNorm, which cannot "
                     "normalise fewer than 2 samples per micro-batch (NaN statistics); use 2 or "
                     "more, or model.batchnorm: false"));
  }
  validateAdapt(cfg, ctx);
  validateShardParameters(cfg, ctx);
  // Note [lever search]: auto is the batch search's choice; a fixed per-GPU batch has no search.
  for (const auto& [key, is_auto] :
       {std::pair<const char*, bool>{"dist.shard", cfg.dist.shard == Shard::kAuto},
        {"model.recompute", cfg.model.recompute == Recompute::kAuto}}) {
    if (!is_auto || b.per_gpu_auto) continue;
    throw err(key, strCat("auto is chosen by the batch search, and batch.per_gpu is fixed (",
                          b.per_gpu, "), so nothing searches: set batch.per_gpu: auto, or ",
                          std::string(key) == "dist.shard" ? "none, optimizer, gradients or parameters" : "off or on"));
  }
  if (builtin_bn && !b.per_gpu_auto && b.per_gpu == 1) {
    throw err("batch.per_gpu", "1 is too small for a model with BatchNorm, which cannot "
                               "normalise one sample per micro-batch (NaN statistics); use 2 or "
                               "more, or model.batchnorm: false");
  }
}

void readTask(Context& ctx, const YAML::Node& root, TaskConfig& c) {
  Section s(ctx, root, "task");
  c.name = s.choice("name", TaskKind::kAuto);
}

/// Note [activation recompute]: model.recompute: on wraps the blocks of the
/// built-in gpt, mlp and resnet18/50 (BatchNorm updates its running statistics
/// once: Note [recompute replay]); the cnn has no blocks, a TorchScript module no
/// blocks batchdist can wrap. Off, the key leaves the resolved config as it was
/// without it (checkpoints and search cache entries of earlier runs still match).
void checkRecompute(Context& ctx, const ModelConfig& c) {
  if (c.recompute == Recompute::kOff) {
    (*ctx.resolved)["model"].erase("recompute");
    return;
  }
  // auto: the batch search weighs it, and says when the model has no blocks (Note [lever search]).
  if (c.recompute == Recompute::kAuto) return;
  const std::string why = recomputeUnsupported(c);
  if (why.empty()) return;
  throw ctx.error("model.recompute",
                  strCat("on is not supported for model.name: ", toString(c.name), ": ", why,
                         "; it is supported for gpt, mlp, resnet18 and resnet50"));
}

void readModel(Context& ctx, const YAML::Node& root, ModelConfig& c) {
  Section s(ctx, root, "model");
  c.name = s.choice("name", ModelName::kMlp);
  c.path = s.text("path", "");
  c.flops_per_sample = s.real("flops_per_sample", 0.0, 0.0, 1e21);
  c.stem = s.choice("stem", ResnetStem::kCifar);
  c.sync_batchnorm = s.boolean("sync_batchnorm", false);
  c.hidden = s.intList("hidden", c.hidden, 1, 1 << 20);
  c.channels = s.intList("channels", c.channels, 1, 1 << 16);
  c.batchnorm = s.boolean("batchnorm", true);
  c.dropout = s.real("dropout", 0.0, 0.0, 0.99);
  c.recompute = s.choice("recompute", Recompute::kOff);
  c.outputs = s.integer("outputs", 0, 0, 1 << 24);
  c.layers = s.integer("layers", 2, 1, 1 << 12);
  c.heads = s.integer("heads", 2, 1, 1 << 12);
  c.embed = s.integer("embed", 64, 1, 1 << 16);
  c.vocab = s.integer("vocab", 256, 2, 1 << 24);
  c.seq_len = s.integer("seq_len", 64, 1, 1 << 20);
  if (c.name == ModelName::kGpt && c.embed % c.heads != 0) {
    throw ctx.error("model.embed",
                    strCat(c.embed, " is not divisible by model.heads (", c.heads,
                           "): each head takes model.embed / model.heads channels; use e.g. "
                           "model.embed: ", (c.embed / c.heads + 1) * c.heads));
  }
  checkRecompute(ctx, c);
  // The gpt keys enter the resolved config of a gpt only: for the other models
  // it stays as before, so their checkpoints still resume (checkResumable
  // compares every model key) and their search cache entries still match. A
  // TorchScript module on token windows keeps model.seq_len and model.vocab, which
  // cut and check its windows (Note [tokens]).
  if (c.name != ModelName::kGpt) {
    const auto data = root["data"];
    const bool windows = c.name == ModelName::kTorchscript && data && data.IsMap() && data["name"] &&
                         data["name"].IsScalar() && data["name"].Scalar() == "tokens";
    for (const char* key : {"layers", "heads", "embed", "vocab", "seq_len"}) {
      if (!windows || (std::string(key) != "vocab" && std::string(key) != "seq_len")) {
        (*ctx.resolved)["model"].erase(key);
      }
    }
  }
  // Note [mfu]: a TorchScript module's own figure; the built-ins count theirs.
  if (c.name != ModelName::kTorchscript) (*ctx.resolved)["model"].erase("flops_per_sample");
}

void readData(Context& ctx, const YAML::Node& root, DataConfig& c) {
  Section s(ctx, root, "data");
  c.name = s.choice("name", DataName::kDigits);
  const bool decoded = c.decoded();
  c.path = s.text("path", "");
  c.val_path = s.text("val_path", "");
  c.list = s.text("list", "");
  c.list_outside_root = s.boolean("list_outside_root", false);
  c.samples = s.integer("samples", 4096, 2, int64_t{1} << 40);
  c.shape = s.intList("shape", c.shape, 1, 1 << 20);
  c.classes_given = s.has("classes");
  c.classes = s.integer("classes", 10, 2, 1 << 20);
  c.val_fraction = s.real("val_fraction", 0.2, 0.0, 0.9);
  c.noise = s.real("noise", 0.5, 0.0, 100.0);
  // Note [loader]: auto (the default) is resolved per rank when the run starts.
  const bool workers_given = s.has("workers");
  c.workers = s.integerOrAuto("workers", 0, 0, &c.workers_auto);
  if (c.workers > 256) {
    throw ctx.error("data.workers", strCat("must be <= 256, got ", c.workers));
  }
  if (!workers_given) c.workers_auto = true;
  (*ctx.resolved)["data"]["workers"] =
      c.workers_auto ? nlohmann::ordered_json("auto") : nlohmann::ordered_json(c.workers);
  c.prefetch = s.integer("prefetch", decoded ? 4 : 2, 1, 1024);
  c.pin_memory = s.boolean("pin_memory", true);
  c.crop_padding = s.integer("crop_padding", 0, 0, 1024);
  // Decoded sources: RandomResizedCrop + flip for training, resize + centre crop
  // for evaluation, ImageNet's normalisation (on the device, after the uint8 copy).
  c.hflip = s.boolean("hflip", decoded);
  c.image_size = s.integer("image_size", 224, 1, 8192);
  c.resize = s.integer("resize", decoded ? (c.image_size * 256 + 112) / 224 : 0, 0, 8192);
  c.crop_scale = s.realList("crop_scale", c.crop_scale, 1e-6, 1.0);
  c.crop_ratio = s.realList("crop_ratio", c.crop_ratio, 1e-3, 1e3);
  const std::vector<double> imagenet_mean{0.485, 0.456, 0.406}, imagenet_std{0.229, 0.224, 0.225};
  c.mean = s.realList("mean", decoded ? imagenet_mean : std::vector<double>{}, -1e6, 1e6);
  c.std = s.realList("std", decoded ? imagenet_std : std::vector<double>{}, 1e-12, 1e6);
  c.on_error = s.choice("on_error", OnError::kSkip);
  c.cache = s.choice("cache", DataCache::kNone);
  c.cache_mb = s.integer("cache_mb", 4096, 1, int64_t{1} << 30);
}

void readBatch(Context& ctx, const YAML::Node& root, BatchConfig& c) {
  Section s(ctx, root, "batch");
  c.global = s.integerOrAuto("global", 0, 1, &c.global_auto);
  // Note [global tokens]: in the resolved config only when given, so a config
  // without it resolves (and keys its search cache entry) as before.
  c.global_tokens = s.integer("global_tokens", 0, 0, kMaxInt);
  if (c.global_tokens == 0) (*ctx.resolved)["batch"].erase("global_tokens");
  c.per_gpu = s.integerOrAuto("per_gpu", 0, 1, &c.per_gpu_auto);
  c.accum = s.integer("accum", 0, 0, 1 << 20);
  c.last_batch = s.choice("last_batch", LastBatch::kDrop);
  c.min_per_gpu = s.integer("min_per_gpu", 2, 1, 1 << 20);
  c.eval_per_gpu = s.integer("eval_per_gpu", 0, 0, 1 << 24);
  c.adapt = s.choice("adapt", BatchAdapt::kOff);
  c.adapt_max = s.integer("adapt_max", 0, 0, kMaxInt);
  c.adapt_every_steps = s.integer("adapt_every_steps", 100, 1, kMaxInt);
  c.adapt_min_steps = s.integer("adapt_min_steps", 8, 1, kMaxInt);
  c.adapt_in_warmup = s.boolean("adapt_in_warmup", false);
  c.adapt_gain = s.choice("adapt_gain", AdaptGain::kAdascale);
}

// Note [global tokens]: batch.global_tokens asks for the global batch in tokens,
// the unit a language model's batch is quoted in. A sample of token data is one
// window of model.seq_len tokens (Note [tokens]) and a step holds whole samples,
// so the config turns it into batch.global here, once: the nearest whole number
// of windows (a half rounds up), at least 1. Everything downstream reads
// batch.global as if the user had written it: the plan, the search's fixed
// global batch, the adaptive batch's G0, the lr's ratio to optim.base_batch (in
// samples, i.e. windows), a resume's check of G against the checkpoint's (the
// resumed run reads the same config, so gets the same G and the same plan).
// global_tokens is kept for the plan to say how it rounded (Plan::global_tokens).
// The resolved config has both, `global` as the windows in force.
void globalFromTokens(Config& cfg, Context& ctx) {
  auto& b = cfg.batch;
  if (b.global_tokens == 0) return;
  const std::string key = "batch.global_tokens";
  if (b.global > 0 || b.global_auto) {
    throw ctx.error(key,
                    strCat(b.global_tokens, " and batch.global (",
                           b.global_auto ? std::string("auto") : std::to_string(b.global),
                           ") both set the global batch; give one: batch.global in samples, or "
                           "batch.global_tokens in tokens"));
  }
  if (cfg.data.name != DataName::kTokens) {
    throw ctx.error(key,
                    strCat("needs data.name: tokens (samples that are windows of model.seq_len "
                           "tokens), but data.name is ", toString(cfg.data.name),
                           ", whose samples are not tokens; give the global batch in samples "
                           "with batch.global"));
  }
  const int64_t len = cfg.model.seq_len;
  const int64_t rest = b.global_tokens % len;
  b.global = std::max<int64_t>(1, b.global_tokens / len + (2 * rest >= len ? 1 : 0));
  (*ctx.resolved)["batch"]["global"] = b.global;
}

void readOptim(Context& ctx, const YAML::Node& root, OptimConfig& c) {
  Section s(ctx, root, "optim");
  c.name = s.choice("name", OptimName::kSgd);
  c.lr = s.real("lr", 0.1, 1e-12, 1e3);
  c.base_batch = s.integer("base_batch", 256, 1, int64_t{1} << 32);
  c.lr_scaling = s.choice("lr_scaling", LrScaling::kLinear);
  c.warmup_epochs = s.real("warmup_epochs", 0.0, 0.0, 1e6);
  c.warmup_steps = s.integer("warmup_steps", -1, -1, int64_t{1} << 40);
  c.schedule = s.choice("schedule", Schedule::kConstant);
  c.min_lr = s.real("min_lr", 0.0, 0.0, 1e3);
  c.step_gamma = s.real("step_gamma", 0.1, 0.0, 1.0);
  c.milestones = s.intList("milestones", {}, 1, int64_t{1} << 30);
  c.momentum = s.real("momentum", 0.9, 0.0, 0.9999);
  c.nesterov = s.boolean("nesterov", false);
  c.weight_decay = s.real("weight_decay", 0.0, 0.0, 10.0);
  c.beta1 = s.real("beta1", 0.9, 0.0, 0.9999);
  c.beta2 = s.real("beta2", 0.999, 0.0, 0.99999);
  c.eps = s.real("eps", 1e-8, 1e-16, 1.0);
  c.trust_coefficient = s.real("trust_coefficient", 0.001, 1e-9, 10.0);
  c.kernels = s.choice("kernels", StepKernels::kAuto);
  c.clip_grad_norm = s.real("clip_grad_norm", 0.0, 0.0, 1e9);
}

void readTrain(Context& ctx, const YAML::Node& root, TrainConfig& c) {
  Section s(ctx, root, "train");
  c.epochs = s.integer("epochs", 10, 1, 1 << 24);
  c.seed = s.integer("seed", 0, 0, kMaxInt);
  c.device = s.choice("device", DeviceKind::kAuto);
  c.memory_format = s.choice("memory_format", MemoryFormat::kAuto);
  c.cudnn_benchmark = s.boolean("cudnn_benchmark", true);
  c.peak_tflops = s.real("peak_tflops", 0.0, 0.0, 1e6);
  c.max_steps = s.integer("max_steps", 0, 0, kMaxInt);
  c.threads = s.integer("threads", 0, 0, 4096);
  c.check_finite = s.boolean("check_finite", true);
  c.noise_scale = s.boolean("noise_scale", true);
  c.noise_scale_every = s.integer("noise_scale_every", 4, 1, kMaxInt);
  c.precision = s.choice("precision", Precision::kFp32);
  c.loss_scale = s.real("loss_scale", 65536.0, 1.0, 1e12);
  c.scale_growth_interval = s.integer("scale_growth_interval", 2000, 1, int64_t{1} << 40);
  c.oom_recover_after_steps = s.integer("oom_recover_after_steps", 0, 0, int64_t{1} << 40);
  c.progress = s.choice("progress", ProgressMode::kAuto);
}

/// dist.shard: optimizer (Note [sharded optimizer]) and gradients (Note [sharded
/// gradients]). None leaves the resolved config as it was without the key
/// (checkpoints and search cache entries of earlier runs still match).
void checkShard(Context& ctx, const DistConfig& c) {
  if (c.shard == Shard::kNone) (*ctx.resolved)["dist"].erase("shard");
  if (c.reshard_after_forward) (*ctx.resolved)["dist"].erase("reshard_after_forward");
  if (c.prefetch) (*ctx.resolved)["dist"].erase("prefetch");
}

void readDist(Context& ctx, const YAML::Node& root, DistConfig& c) {
  Section s(ctx, root, "dist");
  c.backend = s.choice("backend", DistBackend::kAuto);
  c.timeout_s = s.real("timeout_s", 300, 1, 86400 * 7);
  c.interface = s.text("interface", "");
  c.bucket_mb = s.real("bucket_mb", 25, 0.001, 4096);
  c.overlap = s.boolean("overlap", true);
  c.shard = s.choice("shard", Shard::kNone);
  c.reshard_after_forward = s.boolean("reshard_after_forward", true);
  c.prefetch = s.boolean("prefetch", true);
  checkShard(ctx, c);
}

void readSearch(Context& ctx, const YAML::Node& root, SearchConfig& c) {
  Section s(ctx, root, "search");
  c.min = s.integer("min", 8, 1, 1 << 24);
  c.max = s.integer("max", 0, 0, 1 << 24);
  c.multiple_of = s.integer("multiple_of", 8, 1, 1 << 20);
  c.memory_fraction = s.real("memory_fraction", 0.9, 0.05, 1.0);
  c.memory_limit_mb = s.integer("memory_limit_mb", 0, 0, int64_t{1} << 30);
  c.warmup_steps = s.integer("warmup_steps", 1, 0, 1000);
  c.timed_steps = s.integer("timed_steps", 5, 1, 100000);
  c.max_steps = s.integer("max_steps", 1000, 1, 1000000);
  c.min_time_s = s.real("min_time_s", 0.3, 0.0, 3600.0);
  c.max_time_s = s.real("max_time_s", 1.0, 0.0, 3600.0);
  c.rounds = s.integer("rounds", 3, 0, 100);
  c.objective = s.choice("objective", Objective::kThroughput);
  c.tolerance = s.real("tolerance", 0.05, 0.0, 1.0);
  c.cache = s.text("cache", "");
  c.profile = s.boolean("profile", false);
}

// Note [YAML directives]: YAML defines two directives, %YAML and %TAG, and asks
// a processor to ignore any other "with an appropriate warning"; yaml-cpp ignores
// it without one. A config is refused instead, as an unknown key is: no YAML
// processor gives another directive a meaning, so one in a config is a mistake,
// most likely a comment written with another language's '%' (LaTeX, MATLAB),
// which yaml-cpp drops on the first lines but refuses as malformed anywhere else.
// A warning would be printed by every rank and lost in the job's log.
/// Throws ConfigError naming the line of the first directive in `text` (the lines
/// before its document that start with '%') other than %YAML and %TAG.
void checkDirectives(const std::string& text, const std::string& source) {
  std::size_t pos = text.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;  // a UTF-8 byte order mark
  for (int line = 1; pos < text.size(); ++line) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string l = text.substr(pos, end - pos);
    pos = end + 1;
    if (!l.empty() && l.back() == '\r') l.pop_back();
    const auto first = l.find_first_not_of(" \t");
    if (first == std::string::npos || l[first] == '#') continue;  // blank, or a comment
    if (l[0] != '%') return;                                       // the document has begun
    const std::string name = l.substr(1, l.find_first_of(" \t") - 1);
    if (name == "YAML" || name == "TAG") continue;
    if (l.size() > 40) l = l.substr(0, 37) + "...";
    throw ConfigError(strCat(source, ":", line, ": '", l, "' is not a YAML directive (YAML has only "
                             "%YAML and %TAG); a comment starts with '#': remove the line or "
                             "begin it with '#'"));
  }
}

/// The one YAML document of `text`, a mapping (or empty).
YAML::Node loadYaml(const std::string& text, const std::string& source) {
  checkDirectives(text, source);
  YAML::Node root;
  try {
    // Note [one YAML document]: not LoadAll.
    const auto docs = documentStarts(text);
    if (docs.size() > 1) {
      throw ConfigError(strCat(source, ":", docs[1].line + 1, ": holds ", docs.size(),
                               " YAML documents (separated by '---'); a config is one document"));
    }
    if (!docs.empty()) root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) throw ConfigError(strCat(source, ": malformed YAML: ", e.msg));
    throw ConfigError(strCat(source, ":", e.mark.line + 1, ":", e.mark.column + 1,
                             ": malformed YAML: ", e.msg));
  }
  if (root.IsDefined() && !root.IsNull() && !root.IsMap()) {
    throw ConfigError(strCat(source, ": expected a mapping of sections (model, data, batch, optim, "
                             "train, dist, search, checkpoint) at the top level, got ",
                             scalarText(root)));
  }
  return root;
}

void readCheckpoint(Context& ctx, const YAML::Node& root, CheckpointConfig& c) {
  Section s(ctx, root, "checkpoint");
  c.every_steps = s.integerOrAuto("every_steps", 0, 0, &c.every_steps_auto);
  c.every_minutes = s.real("every_minutes", 30, 0, 1e7);
  c.keep = s.integer("keep", 2, 1, 1 << 20);
  c.dir = s.text("dir", "");
  c.on_signal = s.boolean("on_signal", true);
  c.background = s.boolean("background", true);
  c.resume = s.choice("resume", ResumeMode::kOff);
}

void readElastic(Context& ctx, const YAML::Node& root, ElasticConfig& c) {
  Section s(ctx, root, "elastic");
  c.heartbeat_s = s.real("heartbeat_s", 1, 0.05, 60);
  c.heartbeat_timeout_s = s.real("heartbeat_timeout_s", 10, 0.2, 86400);
  c.stall_s = s.real("stall_s", 300, 1, 86400 * 7);
  c.readmit_s = s.real("readmit_s", 60, 0, 86400 * 7);
  c.wait_s = s.real("wait_s", 300, 0, 86400 * 7);
  c.probe_timeout_s = s.real("probe_timeout_s", 10, 0.5, 3600);
  if (c.heartbeat_timeout_s < 2 * c.heartbeat_s) {
    throw ctx.error("elastic.heartbeat_timeout_s",
                    strCat(c.heartbeat_timeout_s,
                           " is less than two heartbeats (elastic.heartbeat_s: ", c.heartbeat_s,
                           "): one late datagram would count as a lost host"));
  }
}

void readProfile(Context& ctx, const YAML::Node& root, ProfileConfig& c) {
  Section s(ctx, root, "profile");
  c.wait = s.integer("wait", 5, 0, int64_t{1} << 40);
  c.warmup = s.integer("warmup", 2, 0, 1000);
  c.active = s.integer("active", 0, 0, 1000);
  c.shapes = s.boolean("shapes", false);
  c.memory = s.boolean("memory", false);
  c.stack = s.boolean("stack", false);
}

void readReport(Context& ctx, const YAML::Node& root, ReportConfig& c) {
  Section s(ctx, root, "report");
  c.tensorboard = s.boolean("tensorboard", true);
  c.sample_s = s.real("sample_s", 0.5, 0.0, 3600.0);
}

/// Unknown keys: sections first, then keys inside known sections.
void checkUnknownKeys(const Context& ctx, const YAML::Node& root) {
  if (root.IsMap()) {
    for (const auto& [key, mark] : mapKeys(ctx, root, "")) {
      if (std::find(kSections.begin(), kSections.end(), key) == kSections.end()) {
        throw ConfigError(strCat(ctx.where(key, mark), ": unknown section '", key,
                                 "' (sections: ", joined(kSections), ")",
                                 suggestion(key, kSections)));
      }
    }
  }
  if (!ctx.unknown.empty()) {
    const auto& u = ctx.unknown.front();
    throw ConfigError(strCat(ctx.where(u.path, u.mark), ": unknown key", suggestion(u.path, ctx.known)));
  }
}

}  // namespace

std::string programOnlyMessage(const char* key) {
  return strCat(key, ": program names the ", std::string(key) == "data.name" ? "data set" : "module",
                " that a program hands to batchdist's library (batchdist::Job::train: "
                "docs/library.md); the batchdist command cannot take one");
}

KeyReason parametersUnsupported(const Config& cfg) {
  if (cfg.model.name != ModelName::kGpt && cfg.model.name != ModelName::kMlp) {
    return {"model.name", strCat(toString(cfg.model.name), " has no parameter units (gpt and "
                                 "mlp have: Note [parameter units])")};
  }
  if (cfg.optim.name == OptimName::kLars) return {"optim.name", "lars reads each layer's whole weight norm"};
  if (cfg.model.sync_batchnorm) {
    return {"model.sync_batchnorm", "its allreduces would interleave with the unit all-gathers a "
                                    "rank that ran out of memory replays (Note [collective replay])"};
  }
  if (cfg.batch.adapt != BatchAdapt::kOff) {
    return {"batch.adapt", strCat(toString(cfg.batch.adapt), " changes the batch mid-run")};
  }
  if (cfg.batch.last_batch == LastBatch::kKeep) {
    return {"batch.last_batch", "keep gives some ranks fewer micro-batches, and every rank "
                                "gathers every unit of every micro-batch"};
  }
  return {};
}

std::string recomputeUnsupported(const ModelConfig& c) {
  if (c.name == ModelName::kTorchscript) return "a TorchScript module has no blocks batchdist can wrap";
  if (c.name == ModelName::kProgram) return "batchdist does not know the blocks of a program's module";
  if (c.name == ModelName::kCnn) return "its convolutions are not grouped into blocks to recompute";
  return "";
}

std::string leversText(const Levers& l) {
  std::string out;
  if (l.shard != Shard::kNone) out = strCat("shard ", toString(l.shard));
  if (l.recompute != Recompute::kOff) {
    out += strCat(out.empty() ? "" : " + ", "recompute", l.recompute == Recompute::kAuto ? " auto" : "");
  }
  return out.empty() ? "plain" : out;
}

bool hasAutoLevers(const Levers& l) {
  return l.shard == Shard::kAuto || l.recompute == Recompute::kAuto;
}

std::string autoLeversText(const Levers& l) {
  std::string out;
  if (l.shard == Shard::kAuto) out = "dist.shard: auto";
  if (l.recompute == Recompute::kAuto) out += strCat(out.empty() ? "" : " and ", "model.recompute: auto");
  return out;
}

nlohmann::ordered_json leversJson(const Levers& l) {
  return {{"shard", toString(l.shard)}, {"recompute", toString(l.recompute)}};
}

Levers leversFromJson(const nlohmann::json& j) {
  Levers l;
  if (!j.is_object()) return l;
  const auto shard = parseEnum<Shard>(j.value("shard", std::string("none")));
  const auto recompute = parseEnum<Recompute>(j.value("recompute", std::string("off")));
  if (!shard || !recompute || *shard == Shard::kAuto || *recompute == Recompute::kAuto) {
    throw std::invalid_argument("unknown levers");
  }
  return {*shard, *recompute};
}

Levers configLevers(const Config& cfg) { return {cfg.dist.shard, cfg.model.recompute}; }

Config withLevers(Config cfg, const Levers& l) {
  cfg.dist.shard = l.shard;
  cfg.model.recompute = l.recompute;
  return cfg;
}

Config parseConfig(const std::string& yaml_text, const std::string& source,
                   const std::vector<std::string>& overrides, SetsFrom sets_from) {
  Config cfg;
  cfg.source = source;
  Context ctx;
  ctx.source = source;
  ctx.sets_from = sets_from;
  ctx.resolved = &cfg.resolved;
  cfg.resolved = nlohmann::ordered_json::object();

  YAML::Node root = loadYaml(yaml_text, source);
  // Map keys and duplicates are refused before --set edits the tree.
  if (root.IsMap()) mapKeys(ctx, root, "");
  for (const auto& o : overrides) applyOverride(root, o, ctx);

  readTask(ctx, root, cfg.task);
  readModel(ctx, root, cfg.model);
  readData(ctx, root, cfg.data);
  readBatch(ctx, root, cfg.batch);
  readOptim(ctx, root, cfg.optim);
  readTrain(ctx, root, cfg.train);
  readDist(ctx, root, cfg.dist);
  readSearch(ctx, root, cfg.search);
  readCheckpoint(ctx, root, cfg.checkpoint);
  readReport(ctx, root, cfg.report);
  readElastic(ctx, root, cfg.elastic);
  readProfile(ctx, root, cfg.profile);

  checkUnknownKeys(ctx, root);
  cfg.data.seq_len = cfg.model.seq_len;  // Note [tokens]: a window is seq_len + 1 tokens
  cfg.data.vocab = cfg.model.vocab;
  globalFromTokens(cfg, ctx);
  validate(cfg, ctx);
  return cfg;
}

Config loadConfig(const std::string& path, const std::vector<std::string>& overrides,
                  SetsFrom sets_from) {
  // Note [input files are regular files]: every rank reads it, and `elastic` again per attempt.
  const auto text = readFileBounded(path, kMaxConfigBytes, "config file",
                                    "every rank reads the config, so give a regular file (save a "
                                    "pipe's output to one first)");
  auto cfg = parseConfig(text, path, overrides, sets_from);
  const auto dir = std::filesystem::path(path).parent_path();
  cfg.base_dir = dir.empty() ? "." : dir.string();
  return cfg;
}

}  // namespace batchdist::worker
