#pragma once
// What the search shows a person: search.json, the table rank 0 prints, and
// search.svg (samples/s and peak memory against per-GPU batch, choice marked).

#include <nlohmann/json.hpp>

#include <string>

#include "worker/search/search.h"

namespace batchdist::worker {

nlohmann::ordered_json searchJson(const SearchResult& r);
/// Inverse of searchJson (the cache reads it back). Throws nlohmann::json::exception
/// or std::invalid_argument on a damaged document.
SearchResult searchFromJson(const nlohmann::json& j);
std::string searchSvg(const SearchResult& r);
std::string searchTable(const SearchResult& r);

/// {"shard": ..., "recompute": ...}: how search.json, report.json and a checkpoint's
/// manifest write levers (Note [lever search]).
nlohmann::ordered_json leversJson(const Levers& l);

/// `s` with &, <, >, " and ' escaped for XML text and attributes.
std::string xmlEscape(const std::string& s);

}  // namespace batchdist::worker
