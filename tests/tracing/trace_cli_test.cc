// `meshtrain train --trace FILE`: the file is a Chrome trace with one process
// per rank, one named track per stream, complete events named as the
// simulator names ops, with shapes and bytes, in increasing time per rank.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/run_meshtrain.h"
#include "tests/tracing/cli_scratch.h"

using meshtrain::testing::read_json;
using meshtrain::testing::trace_scratch;
using meshtrain::testing::training_text;
using nlohmann::json;

namespace {

const std::string kRun = " --model tiny --seq-len 32 --micro-batch 2 --steps 2 --warmup 0 --quiet";

// The trace file `name` of a successful `train ... flags --trace`.
json traced(const std::string& name, const std::string& flags) {
  const auto path = trace_scratch(name);
  MeshtrainRun r = run_meshtrain("train --data " + training_text() + kRun + flags + " --trace " + path.string());
  INFO(r.out);
  REQUIRE(r.status == 0);
  return read_json(path);
}

// Integer nanoseconds from the file's microseconds (three decimals).
std::int64_t ns(const json& us) { return std::llround(us.get<double>() * 1000.0); }

struct Summary {
  std::map<int, std::string> processes;                // pid -> name
  std::map<std::pair<int, int>, std::string> tracks;   // (pid, tid) -> name
  std::map<int, std::multiset<std::string>> ops;       // pid -> op names
  std::vector<json> events;                            // the "X" events
};

// Reads the trace and checks what holds for every run: the layout, complete
// events only, and per rank each event starting after the previous one ended
// (the cpu backend runs ops one after another on the rank's thread).
Summary summarise(const json& trace) {
  REQUIRE(trace.at("displayTimeUnit") == "ns");
  Summary s;
  std::map<int, std::int64_t> last_end;
  for (const json& e : trace.at("traceEvents")) {
    const int pid = e.at("pid").get<int>();
    if (e.at("ph") == "M") {
      if (e.at("name") == "process_name") s.processes[pid] = e.at("args").at("name");
      if (e.at("name") == "thread_name") s.tracks[{pid, e.at("tid").get<int>()}] = e.at("args").at("name");
      continue;
    }
    REQUIRE(e.at("ph") == "X");
    CHECK(s.tracks.count({pid, e.at("tid").get<int>()}) == 1);
    const std::int64_t start = ns(e.at("ts")), dur = ns(e.at("dur"));
    CHECK(dur >= 0);
    if (last_end.count(pid)) {
      INFO("rank " << pid << " event " << e.dump() << " starts before the previous one ended");
      CHECK(start >= last_end[pid]);
    }
    last_end[pid] = start + dur;
    s.ops[pid].insert(e.at("name").get<std::string>());
    s.events.push_back(e);
  }
  return s;
}

}  // namespace

TEST_CASE("a tp2 run with ranks as threads traces both ranks", "[trace]") {
  const Summary s = summarise(traced("tp2.json", " --tp 2"));
  CHECK(s.processes == std::map<int, std::string>{{0, "rank 0 (cpu)"}, {1, "rank 1 (cpu)"}});
  CHECK(s.tracks.at({0, 0}) == "compute");
  CHECK(s.tracks.at({1, 0}) == "compute");
  for (int rank : {0, 1}) {
    INFO("rank " << rank);
    for (const char* op : {"gemm", "attention_forward", "attention_backward", "layernorm_forward",
                           "cross_entropy_loss", "all_reduce", "adamw", "write", "read"})
      CHECK(s.ops.at(rank).count(op) > 0);
  }
  // Both ranks issue the same tensor-parallel all-reduces, with nccl-tests bytes.
  CHECK(s.ops.at(0).count("all_reduce") == s.ops.at(1).count("all_reduce"));
  int tensor_parallel = 0;
  for (const json& e : s.events) {
    if (e.at("name") != "all_reduce") continue;
    CHECK(e.at("cat") == "all_reduce");
    // The row-parallel outputs (B·T, C) = (64, 64) of the tiny model, over the tp pair.
    if (e.at("args").at("shapes").at(0) == "(64, 64)") {
      CHECK(e.at("args").at("members") == 2);
      CHECK(e.at("args").at("bytes") == 64 * 64 * 4);
      ++tensor_parallel;
    }
  }
  CHECK(tensor_parallel > 0);
  for (const json& e : s.events)
    if (e.at("name") == "gemm") CHECK(e.at("cat") == "compute");
}

TEST_CASE("a single-rank run traces one process", "[trace]") {
  const Summary s = summarise(traced("single.json", ""));
  CHECK(s.processes == std::map<int, std::string>{{0, "rank 0 (cpu)"}});
  for (const char* op : {"gemm", "embedding_forward", "gelu_forward", "adamw", "synchronize"})
    CHECK(s.ops.at(0).count(op) > 0);
  // The engine still issues its loss and norm reductions; on one rank they are over groups of one.
  for (const json& e : s.events)
    if (e.at("name") == "all_reduce") CHECK(e.at("args").at("members") == 1);
  // Two steps update the same parameters: the optimizer runs equally often in each.
  CHECK(s.ops.at(0).count("adamw") % 2 == 0);
}

TEST_CASE("a pipeline run traces send and recv with their peers", "[trace]") {
  const Summary s = summarise(traced("pp2.json", " --pp 2 --global-batch 4"));
  REQUIRE(s.processes.size() == 2);
  int sends = 0, recvs = 0;
  for (const json& e : s.events) {
    if (e.at("name") != "send" && e.at("name") != "recv") continue;
    (e.at("name") == "send" ? sends : recvs)++;
    CHECK(e.at("cat") == e.at("name"));
    CHECK(e.at("args").at("peer") == 1 - e.at("pid").get<int>());
    CHECK(e.at("args").at("bytes") == 2 * 32 * 64 * 4);  // one micro-batch's (B, T, C) activation
  }
  // 2 micro-batches x 2 steps: activations one way, gradients back.
  CHECK(sends == 8);
  CHECK(recvs == 8);
}

TEST_CASE("an unwritable trace path is refused before training", "[trace]") {
  MeshtrainRun r = run_meshtrain("train --data " + training_text() + kRun +
                                 " --trace /nonexistent-dir/trace.json");
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("cannot write trace file '/nonexistent-dir/trace.json'"));
}
