// root_exchange.h under mpirun -np 3: clock offsets against rank 0 and the
// gather of byte strings to rank 0, with one process that never sends.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <string>

#include "backends/comm/root_exchange.h"
#include "tests/mpi_catch_main.h"

using namespace meshtrain;

namespace {

const MpiEnvironment& env() {
  static auto e = MpiEnvironment::init(nullptr, nullptr);  // adopts the runner's MPI
  return **e;
}

constexpr std::chrono::milliseconds kTimeout{20000};

}  // namespace

TEST_CASE("each rank's clock offset against rank 0 is found within its stated uncertainty", "[comm][mpi]") {
  // One machine, one steady clock: the only offsets are the shifts given here.
  const std::int64_t shifts[] = {0, 5'000'000'000, -3'000'000'000};
  const std::int64_t shift = shifts[env().rank() % 3];
  const auto clock = [shift] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
               .count() +
           shift;
  };
  auto c = clock_offset_to_root(env(), clock, kTimeout);
  REQUIRE(c.ok());
  INFO("rank " << env().rank() << " offset " << c->offset_ns << " +- " << c->uncertainty_ns);
  CHECK(c->uncertainty_ns >= 0);
  CHECK(std::llabs(c->offset_ns - (shifts[0] - shift)) <= c->uncertainty_ns + 1);
  if (env().rank() == 0) CHECK((c->offset_ns == 0 && c->uncertainty_ns == 0));
}

TEST_CASE("rank 0 gathers every rank's string, by rank", "[comm][mpi]") {
  const int r = env().rank();
  const std::string mine(static_cast<std::size_t>(r * 1000 + 1), static_cast<char>('a' + r));
  auto got = gather_to_root(env(), mine, kTimeout);
  REQUIRE(got.ok());
  if (r != 0) {
    CHECK(got->empty());
    return;
  }
  REQUIRE(got->size() == static_cast<std::size_t>(env().world_size()));
  for (int p = 0; p < env().world_size(); ++p) {
    REQUIRE((*got)[p].has_value());
    CHECK(*(*got)[p] == std::string(static_cast<std::size_t>(p * 1000 + 1), static_cast<char>('a' + p)));
  }
}

TEST_CASE("a rank that never sends is missing on rank 0 after the timeout, the others arrive", "[comm][mpi]") {
  const int r = env().rank();
  if (r == 2) return;  // stands for a process that died or hangs
  const std::string mine = "from " + std::to_string(r);
  auto got = gather_to_root(env(), mine, std::chrono::milliseconds(500));
  REQUIRE(got.ok());
  if (r != 0) return;
  REQUIRE(got->size() == 3);
  CHECK((*got)[0] == std::optional<std::string>("from 0"));
  CHECK((*got)[1] == std::optional<std::string>("from 1"));
  CHECK_FALSE((*got)[2].has_value());
}

int main(int argc, char** argv) { return meshtrain::testing::run_catch_under_mpi(argc, argv); }
