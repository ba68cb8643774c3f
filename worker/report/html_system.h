#pragma once
// report.html's section on Note [system metrics]: a row of charts per host.

#include <nlohmann/json.hpp>

#include <string>

namespace batchdist::worker {

/// The section for report.json's "system" (every rank's series), a row of
/// charts per host: GPU busy, GPU memory used, power, temperature, CPU and the
/// loader threads, a line per rank of that host; then what each rank could not
/// read. "" when the report has no "system".
std::string systemSection(const nlohmann::ordered_json& report);

}  // namespace batchdist::worker
