// Under `mpirun -np 4`: the plans tp2 pp2 dp1 ZeRO-1, for a mixture of
// experts tp2 dp2 ep2 ZeRO-1, and a plan made of segments, run with ranks as MPI processes, give the same
// bits (losses, gradient norms, gathered state) as the same plan with ranks as
// threads, which each process also runs.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "backends/cpu/comm/in_process.h"
#include "backends/cpu/comm/mpi_communicator.h"
#include "engine/plan/segment_plan.h"
#include "tests/mpi_catch_main.h"
#include "tests/parallel/parallel_harness.h"

using namespace meshtrain;
using namespace meshtrain::testing;

namespace {

// Runs `p` over MPI and again as threads in this process; the bits must agree.
void check_mpi_matches_threads(const ModelSpec& m, const Plan& p) {
  INFO("seed " << kSeed << ", model " << m.name);
  auto mpi = MpiCommunicator::create();
  REQUIRE(mpi.ok());
  REQUIRE((*mpi)->world_size() == p.world_size());

  RankRun over_mpi;
  {
    CpuBackend b(**mpi);
    const Status s = run_rank(b, m, p, over_mpi);
    INFO((s.ok() ? std::string() : s.error().message()));
    REQUIRE(s.ok());
  }
  std::vector<RankRun> threads(static_cast<std::size_t>(p.world_size()));
  const Status s = run_ranks(p.world_size(), [&](int rank, Communicator& comm) -> Status {
    CpuBackend b(comm);
    return run_rank(b, m, p, threads[static_cast<std::size_t>(rank)]);
  });
  REQUIRE(s.ok());
  const RankRun& mine = threads[static_cast<std::size_t>((*mpi)->rank())];
  CHECK(over_mpi.losses == mine.losses);
  CHECK(over_mpi.grad_norms == mine.grad_norms);
  // export_state fills rank 0's copy only.
  CHECK(over_mpi.state == mine.state);
  CHECK(over_mpi.losses.back() < over_mpi.losses.front());
}

}  // namespace

TEST_CASE("a hybrid plan under MPI matches the in-process run bit for bit", "[parallel][mpi]") {
  check_mpi_matches_threads(tiny_gpt(), make_plan(2, 2, 1, 1, ScheduleKind::one_f_one_b));
}

TEST_CASE("an MoE plan (tp 2, ep 2, capacity) under MPI matches the in-process run bit for bit",
          "[parallel][mpi][moe]") {
  ModelSpec m = *model_preset("tiny-moe");
  m.capacity_factor = 1.0f;  // the all-to-alls carry uneven counts, and some tokens are dropped
  Plan p = make_plan(2, 1, 2, 1, ScheduleKind::one_f_one_b);
  p.ep = 2;
  check_mpi_matches_threads(m, p);
}

TEST_CASE("a plan made of segments under MPI matches the in-process run bit for bit", "[parallel][mpi][segments]") {
  // Two segments on disjoint ranks (send/recv) and a boundary on the same ranks (all-to-all).
  const ModelSpec m = tiny_llama();
  Plan p = make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b);
  auto segments = segments_from_json(nlohmann::json::parse(R"([
      {"blocks": [0, 1], "tp": 2, "ranks": [0, 1]},
      {"blocks": [2, 2], "dp": 2, "ranks": [2, 3]},
      {"blocks": [3, 5], "pp": 2, "ranks": [2, 3], "microbatches": 4}])"),
                                     m, p);
  REQUIRE(segments.ok());
  p.segments = *segments;
  REQUIRE(validate_plan(p, m).ok());
  check_mpi_matches_threads(m, p);
}

TEST_CASE("context parallelism under MPI (all-gather and ring) matches the in-process run bit for bit",
          "[parallel][mpi][cp]") {
  // The ring's send/recv tags (models/context_parallel.h) must fit MPI's tag range.
  for (const ContextComm comm : {ContextComm::all_gather, ContextComm::ring}) {
    Plan p = make_plan(1, 2, 1, 1, ScheduleKind::one_f_one_b);
    p.cp = 2, p.cp_comm = comm;
    INFO(context_comm_name(comm));
    check_mpi_matches_threads(tiny_llama(), p);
  }
}

int main(int argc, char** argv) { return meshtrain::testing::run_catch_under_mpi(argc, argv); }
