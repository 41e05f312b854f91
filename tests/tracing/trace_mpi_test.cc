// `mpirun -np 2 meshtrain train --pp 2 --trace t.json`: rank 0 writes one
// trace of both ranks, on its clock. Checked by causality, which no load can
// break, never by wall time: each recv of a pipeline message ends after the
// matching send began, and every event of rank 1 comes after rank 0 began
// recording (rank 0's recorder exists before the communicator both ranks
// make together), each up to the clock estimate's stated uncertainty.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/run_meshtrain.h"
#include "tests/tracing/cli_scratch.h"

using meshtrain::testing::read_json;
using meshtrain::testing::trace_scratch;
using meshtrain::testing::training_text;
using nlohmann::json;

namespace {

// (pid, peer, tag) -> the [start, end] in µs of each send or recv, in issue order.
using Messages = std::map<std::tuple<int, int, int>, std::vector<std::pair<double, double>>>;

// `train` of the tiny model on 2 pipeline stages, tracing to path.
MeshtrainRun train_traced(const std::filesystem::path& path, const std::string& flags) {
  return run_meshtrain("train --data " + training_text() +
                       " --model tiny --seq-len 32 --micro-batch 2 --global-batch 4 --warmup 0 --quiet --pp 2" + flags +
                       " --trace " + path.string());
}

}  // namespace

TEST_CASE("under MPI rank 0 writes one trace of every rank on one clock", "[trace][mpi]") {
  const auto path = trace_scratch("mpi.json");
  MeshtrainRun run = train_traced(path, " --steps 2");
  INFO(run.out);
  REQUIRE(run.status == 0);
  for (int r : {0, 1})  // no per-rank files any more
    CHECK_FALSE(std::filesystem::exists(path.parent_path() / ("mpi.rank" + std::to_string(r) + ".json")));
  const json trace = read_json(path);
  std::map<int, json> process;  // pid -> process_name args
  std::map<int, int> ops;       // pid -> complete events
  Messages sends, recvs;
  std::map<int, double> first;  // pid -> its earliest event's start
  for (const json& e : trace.at("traceEvents")) {
    const int pid = e.at("pid");
    if (e.at("ph") == "M" && e.at("name") == "process_name") process[pid] = e.at("args");
    if (e.at("ph") != "X") continue;
    ++ops[pid];
    const double ts = e.at("ts"), end = ts + e.at("dur").get<double>();
    if (!first.count(pid) || ts < first[pid]) first[pid] = ts;
    if (e.at("name") == "send" || e.at("name") == "recv")
      (e.at("name") == "send" ? sends : recvs)[{pid, e.at("args").at("peer"), e.at("args").at("tag")}].push_back(
          {ts, end});
  }
  REQUIRE(process.size() == 2);
  CHECK(process[0].at("name") == "rank 0 (cpu)");
  CHECK(process[1].at("name") == "rank 1 (cpu)");
  CHECK(process[0].at("clock_offset_ns") == 0);
  CHECK(process[0].at("clock_uncertainty_ns") == 0);
  const double uncertainty_us = process[1].at("clock_uncertainty_ns").get<double>() / 1000;
  CHECK(uncertainty_us >= 0);
  CHECK(ops[0] > 0);
  CHECK(ops[1] > 0);
  CHECK(first[1] >= -uncertainty_us);
  // 2 micro-batches x 2 steps: activations 0 -> 1, gradients 1 -> 0.
  int matched = 0;
  for (const auto& [key, sent] : sends) {
    const auto [from, to, tag] = key;
    const auto got = recvs.find({to, from, tag});
    REQUIRE(got != recvs.end());
    REQUIRE(got->second.size() == sent.size());
    for (std::size_t i = 0; i < sent.size(); ++i, ++matched) {
      INFO("message " << i << " from rank " << from << " to " << to << " tag " << tag);
      CHECK(got->second[i].second + uncertainty_us >= sent[i].first);
    }
  }
  CHECK(matched == 8);
}

TEST_CASE("under MPI a rank that stops answering is left out of the trace, not waited for", "[trace][mpi]") {
  const auto path = trace_scratch("mpi-hang.json");
  MeshtrainRun run = train_traced(path, " --steps 4 --comm-timeout 1 --fault-inject 1:hang:2");
  INFO(run.out);
  CHECK(run.status != 0);
  CHECK_THAT(run.out, Catch::Contains("timed out"));
  // Rank 0 still wrote what it had: its own row, its steps up to the failure.
  const json trace = read_json(path);
  int ops = 0;
  for (const json& e : trace.at("traceEvents")) {
    CHECK(e.at("pid") == 0);
    ops += e.at("ph") == "X";
  }
  CHECK(ops > 0);
}
