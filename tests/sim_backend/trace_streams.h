// A simulated Chrome trace read back for the tests that check what ran
// when: rank 0's complete events, stream by stream.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::sim_testing {

struct TraceOp {
  std::string name;
  double ts = 0, end = 0;  // µs
};

// The first process's (rank 0's) complete events, keyed by the name of the
// stream ("compute", "data-parallel 1", ...) that ran them, each sorted by start.
inline std::map<std::string, std::vector<TraceOp>> rank0_streams(const std::string& json) {
  const nlohmann::json t = nlohmann::json::parse(json);
  int pid0 = -1;
  std::map<int, std::string> names;  // tid -> stream name on pid0
  for (const auto& e : t.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "process_name" && pid0 < 0) pid0 = e.at("pid").get<int>();
  for (const auto& e : t.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "thread_name" && e.at("pid").get<int>() == pid0)
      names[e.at("tid").get<int>()] = e.at("args").at("name").get<std::string>();
  std::map<std::string, std::vector<TraceOp>> streams;
  for (const auto& e : t.at("traceEvents")) {
    if (e.at("ph") != "X" || e.at("pid").get<int>() != pid0) continue;
    const double ts = e.at("ts").get<double>();
    streams[names[e.at("tid").get<int>()]].push_back({e.at("name").get<std::string>(), ts, ts + e.at("dur").get<double>()});
  }
  for (auto& [name, ops] : streams)
    std::sort(ops.begin(), ops.end(), [](const TraceOp& a, const TraceOp& b) { return a.ts < b.ts; });
  return streams;
}

// The ops of every stream whose name starts with `prefix` (a kind of stream:
// "data-parallel" takes each of its numbered streams), sorted by start.
inline std::vector<TraceOp> stream_ops(const std::map<std::string, std::vector<TraceOp>>& streams,
                                       std::string_view prefix) {
  std::vector<TraceOp> out;
  for (const auto& [name, ops] : streams)
    if (name.rfind(prefix, 0) == 0) out.insert(out.end(), ops.begin(), ops.end());
  std::stable_sort(out.begin(), out.end(), [](const TraceOp& a, const TraceOp& b) { return a.ts < b.ts; });
  return out;
}

}  // namespace meshtrain::sim_testing
