// `mpirun -np 2 meshtrain train --tp 2 --trace t.json`: each process writes
// its own rank's trace, t.rank0.json and t.rank1.json, each valid and holding
// only its rank, with the tensor-parallel all-reduces on both.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/run_meshtrain.h"
#include "tests/tracing/cli_scratch.h"

using meshtrain::testing::trace_scratch;
using meshtrain::testing::training_text;
using nlohmann::json;

TEST_CASE("under MPI each rank writes FILE.rank<N>.json", "[trace][mpi]") {
  const auto path = trace_scratch("mpi.json");
  const auto rank_file = [&](int r) {
    return path.parent_path() / ("mpi.rank" + std::to_string(r) + ".json");
  };
  for (int r : {0, 1}) std::filesystem::remove(rank_file(r));
  MeshtrainRun run = run_meshtrain("train --data " + training_text() +
                                   " --model tiny --seq-len 32 --micro-batch 2 --steps 2 --warmup 0"
                                   " --quiet --tp 2 --trace " + path.string());
  INFO(run.out);
  REQUIRE(run.status == 0);
  CHECK_FALSE(std::filesystem::exists(path));  // no shared file under MPI
  for (int r : {0, 1}) {
    INFO("rank " << r);
    std::ifstream in(rank_file(r));
    REQUIRE(in.good());
    const json trace = json::parse(in);
    int all_reduces = 0;
    for (const json& e : trace.at("traceEvents")) {
      CHECK(e.at("pid") == r);
      if (e.at("ph") == "M" && e.at("name") == "process_name")
        CHECK(e.at("args").at("name") == "rank " + std::to_string(r) + " (cpu)");
      if (e.at("ph") == "X" && e.at("name") == "all_reduce" && e.at("args").at("members") == 2)
        ++all_reduces;
    }
    CHECK(all_reduces > 0);
  }
}
