// The backend registry (engine/cli/backend_registry.h): the one place that
// builds a rank's backend by name, alone or as threads of one process.
#include <catch2/catch.hpp>

#include <atomic>
#include <vector>

#include "engine/cli/backend_registry.h"

using namespace meshtrain;

TEST_CASE("the registry names its backends and refuses others with the nearest", "[cli][backends]") {
  CHECK(backend_names() == std::vector<std::string>{"cpu", "cuda"});
  CHECK(check_backend_name("cpu").ok());
  CHECK(check_backend_name("cuda").ok());
  const Status bad = check_backend_name("cpuu");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message() == "unknown --backend 'cpuu' (did you mean 'cpu'? valid: cpu, cuda)");
  const auto made = make_backend({.name = "sim"});
  REQUIRE_FALSE(made.ok());
  CHECK_THAT(made.error().message(), Catch::Contains("unknown --backend 'sim'"));
}

TEST_CASE("a cpu rank alone is a world of one with its share of the cores", "[cli][backends]") {
  auto b = make_backend({.name = "cpu", .threads = 0, .ranks_sharing = 1});
  REQUIRE(b.ok());
  CHECK((*b)->name() == "cpu");
  CHECK((*b)->rank() == 0);
  CHECK((*b)->world_size() == 1);
  CHECK(cpu_threads_per_rank(3, 8) == 3);  // a --threads flag is taken as given
  CHECK(cpu_threads_per_rank(0, 1) == available_cpu_cores());
  CHECK(cpu_threads_per_rank(0, 1 << 20) == 1);  // at least one each
  CHECK(backend_device_name("cpu").empty());
}

TEST_CASE("rank threads each get a backend of one world and can sum over it", "[cli][backends]") {
  // Catch's assertions are not thread-safe: the ranks record, the test checks after.
  std::vector<float> sums(3, 0.f);
  std::vector<int> ranks(3, -1), worlds(3, -1);
  std::atomic<int> seen{0};
  const Status s = run_thread_ranks({.name = "cpu", .threads = 1}, 3, [&](int rank, Backend& b) -> Status {
    ranks[static_cast<std::size_t>(rank)] = b.rank();
    worlds[static_cast<std::size_t>(rank)] = b.world_size();
    Tensor x = b.empty(Shape{1});
    const float v = static_cast<float>(rank + 1);
    b.write(x, std::span<const float>(&v, 1));
    b.all_reduce(x, Group{0, {0, 1, 2}}, ReduceOp::sum);
    MT_TRY(b.read(x, std::span<float>(&sums[static_cast<std::size_t>(rank)], 1)));
    ++seen;
    return b.synchronize();
  });
  REQUIRE(s.ok());
  CHECK(seen == 3);
  CHECK(ranks == std::vector<int>{0, 1, 2});
  CHECK(worlds == std::vector<int>{3, 3, 3});
  CHECK(sums == std::vector<float>{6.f, 6.f, 6.f});
}

TEST_CASE("cuda ranks are never threads: the registry says how to launch them", "[cli][backends]") {
  const Status s = run_thread_ranks({.name = "cuda"}, 4, [](int, Backend&) { return ok_status(); });
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().message() ==
        "the cuda backend runs one rank per process, and 4 ranks were asked for; launch them with "
        "`mpirun -np 4 meshtrain ...` or srun");
}
