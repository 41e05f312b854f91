// Faults in a real run with ranks as threads (--fault-inject): a slowed rank
// is named by the straggler report, a rank that stops answering or dies is
// detected after --comm-timeout and named with the op and group, nothing
// hangs, and the last checkpoint resumes.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "tests/run_meshtrain.h"
#include "tests/train/fault_scratch.h"

using namespace meshtrain::testing;

TEST_CASE("a deliberately slowed rank is named as the straggler", "[train][faults]") {
  const auto lines = metrics_of_run("slow.jsonl", " --dp 2 --steps 5 --fault-inject 1:slow:2:32");
  REQUIRE(lines.size() == 5);
  for (const auto& j : lines) {
    REQUIRE(j.contains("rank_compute_s"));
    CHECK(j["rank_compute_s"].size() == 2);
    CHECK(j["rank_comm_s"].size() == 2);
    if (j["step"] < 3) continue;
    CAPTURE(j.dump());
    check_rank_1_straggles(j);
    CHECK(j["straggler_lag_s"].get<double>() > 0);
    // Its peer waits for it in the collectives.
    CHECK(j["rank_comm_s"][0].get<double>() > j["rank_comm_s"][1].get<double>());
  }
  MeshtrainRun shown = run_meshtrain("train --data " + training_text() + " --model tiny --seq-len 64 --micro-batch 4"
                                     " --warmup 1 --dp 2 --steps 3 --fault-inject 1:slow:1:32");
  CHECK_THAT(shown.out, Catch::Contains("| slowest rank 1 +"));
}

TEST_CASE("a rank that stops answering is named after the comm timeout and the last checkpoint resumes",
          "[train][faults]") {
  const std::string common = checkpointed_train("hang-ckpt");
  const auto start = std::chrono::steady_clock::now();
  check_fails_naming(common + " --fault-inject 1:hang:4",
                     Catch::Contains("rank 1 stops answering at step 4") && Catch::Contains("on group") &&
                         Catch::Contains("(ranks [0, 1])") &&
                         Catch::Contains("timed out after 2000 ms; still waiting for rank 1"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 30);  // the hung rank gives up too: nothing waits forever
  check_resumes(common, 3, 6);  // the checkpoint of step 2 is intact
}

TEST_CASE("a rank that dies mid-step fails the run, named with its step", "[train][faults]") {
  check_fails_naming(fault_train(" --tp 2 --pp 2 --steps 4 --comm-timeout 5 --fault-inject 3:exit:2"),
                     Catch::Contains("rank 3 dies at step 2") &&
                         Catch::Contains("the run lost a rank (rank 3 at step 2, by --fault-inject)"));
}

TEST_CASE("fault-inject specs are checked", "[train][faults]") {
  const std::string base = fault_train(" --dp 2 --steps 2 --fault-inject ");
  CHECK_THAT(run_meshtrain(base + "1:explode:2").out, Catch::Contains("the kind is slow, hang, exit, signal or throw"));
  CHECK_THAT(run_meshtrain(base + "2:exit:1").out, Catch::Contains("rank 2 is outside the world of 2 ranks"));
  CHECK_THAT(run_meshtrain(base + "1:hang:2:3").out, Catch::Contains("only slow takes a factor"));
  CHECK_THAT(run_meshtrain(base + "1:slow").out, Catch::Contains("write RANK:slow:STEP[:FACTOR]"));
}
