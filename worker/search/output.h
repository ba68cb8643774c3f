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

}  // namespace batchdist::worker
