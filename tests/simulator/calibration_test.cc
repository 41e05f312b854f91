// The additive fields of the calibration format (machine, per-op tables,
// spread, sharing levels, transports, link latency, attention backward).
#include <catch2/catch.hpp>

#include "simulator/calibration.h"
#include "simulator/cost_model.h"

using namespace meshtrain::sim;

namespace {

Calibration example() {
  Calibration c;
  c.machine.backend = "cpu";
  c.machine.cpu = "AMD EPYC";
  c.machine.cores = 2;
  c.machine.date = "2026-12-02T14:00:00Z";
  c.machine.libraries = {{"OpenBLAS", "0.3.21"}, {"oneTBB", "2021.8.0"}};
  c.machine.notes = {"mpi: not measured"};
  c.gemm = {{64, 64, 64, DType::kFp32, 10, {9, 12, 5, 1}},
            {64, 64, 64, DType::kFp32, 19, {18, 21, 5, 2}}};
  c.attention = {{32, 64, 16, true, 40, false, {}}, {32, 64, 16, true, 150, true, {}}};
  c.ops = {{"gelu_forward", 1e6, 200, {190, 230, 9, 1}},
           {"gelu_forward", 4e6, 800, {}},
           {"gelu_forward", 1e6, 390, {0, 0, 0, 2}}};
  c.memory = {{1e6, 50}};
  c.links = {{"nvlink", 6.5, 12.5}};
  c.collectives = {{CollectiveKind::kAllReduce, 2, 1e6, 3, "threads", {300, 400, 5, 1}},
                   {CollectiveKind::kAllReduce, 2, 1e6, 1, "mpi", {}},
                   {CollectiveKind::kAllReduce, 2, 1e6, 2, "", {}}};
  return c;
}

}  // namespace

TEST_CASE("calibration additions round-trip exactly", "[simulator][calibration]") {
  const std::string text = calibration_to_json(example());
  auto back = calibration_from_json(text);
  REQUIRE(back.ok());
  CHECK(calibration_to_json(*back) == text);
  CHECK(back->machine.cores == 2);
  CHECK(back->machine.notes.size() == 1);
  CHECK(back->gemm[1].spread.ranks_sharing == 2);
  CHECK(back->gemm[0].spread.p90_us == 12);
  CHECK(back->attention[1].backward);
  CHECK(back->links[0].latency_us == 12.5);
  CHECK(back->collectives[1].transport == "mpi");
}

TEST_CASE("a version-1 file without the additions reads as before", "[simulator][calibration]") {
  auto c = calibration_from_json(
      R"({"version": 1, "memory": [{"bytes": 1000, "time_us": 2}]})");
  REQUIRE(c.ok());
  CHECK(c->machine.empty());
  CHECK(c->sharing_levels() == std::vector<int>{1});
  CHECK(calibration_to_json(*c).find("machine") == std::string::npos);
  CHECK(calibration_to_json(*c).find("ops") == std::string::npos);
}

TEST_CASE("sharing levels and transports select entries", "[simulator][calibration]") {
  const Calibration c = example();
  CHECK(c.sharing_levels() == std::vector<int>{1, 2});
  CHECK(*c.for_ranks_sharing(1).gemm_time(64, 64, 64, DType::kFp32) == Approx(10e-6));
  CHECK(*c.for_ranks_sharing(2).gemm_time(64, 64, 64, DType::kFp32) == Approx(19e-6));
  // More ranks than any measured level: the largest level below.
  CHECK(*c.for_ranks_sharing(8).op_time("gelu_forward", 1e6) == Approx(390e-6));
  // A table measured at one level only is kept whole.
  CHECK(c.for_ranks_sharing(2).attention.size() == 2);
  CHECK(c.for_transport("threads").collectives.size() == 2);
  CHECK(*c.for_transport("threads").for_ranks_sharing(1).collective_busbw(
            CollectiveKind::kAllReduce, 2, 1e6) > 0);
}

TEST_CASE("per-op tables and attention backward replace the generic costs",
          "[simulator][calibration]") {
  const Calibration c = example().for_ranks_sharing(1);
  CostModel m(cluster_preset("local-cpu")->device, CostConstants{}, &c);
  CHECK(to_seconds(m.memory_bound(1e6, "gelu_forward")) == Approx(200e-6));
  // Interpolated in log(bytes) of throughput between 1e6 and 4e6: constant here.
  CHECK(to_seconds(m.memory_bound(2e6, "gelu_forward")) == Approx(400e-6));
  // An op the calibration did not measure falls back to the by-bytes table.
  CHECK(to_seconds(m.memory_bound(1e6, "add")) == Approx(50e-6));
  CHECK(to_seconds(m.memory_bound(1e6)) == Approx(50e-6));
  CHECK(to_seconds(m.attention(32, 64, 16, true, true, DType::kFp32)) == Approx(150e-6));
  CHECK(to_seconds(m.attention(32, 64, 16, true, false, DType::kFp32)) == Approx(40e-6));
  auto spec = *cluster_preset("local-cpu");
  apply_link_calibration(c, spec);
  CHECK(spec.nvlink_bandwidth == 6.5e9);
  CHECK(to_seconds(spec.nvlink_latency) == Approx(12.5e-6));
}

TEST_CASE("bad additions are rejected naming the field", "[simulator][calibration]") {
  auto err = [](const char* t) {
    auto r = calibration_from_json(t);
    REQUIRE_FALSE(r.ok());
    return r.error().message();
  };
  CHECK_THAT(err(R"({"version": 1, "machine": {"cores": 0}})"), Catch::Contains("machine field 'cores' must be an integer in [1, 1048576]"));
  CHECK_THAT(err(R"({"version": 1, "machine": {"gpu": "x"}})"),
             Catch::Contains("unknown field 'machine.gpu'"));
  CHECK_THAT(err(R"({"version": 1, "ops": [{"bytes": 1, "time_us": 1}]})"),
             Catch::Contains("ops[0]: missing field 'op'"));
  CHECK_THAT(err(R"({"version": 1, "gemm": [{"m": 1, "n": 1, "k": 1, "time_us": 1,
                     "ranks_sharing": 0}]})"),
             Catch::Contains("'ranks_sharing' must be an integer in [1, 1024]"));
  CHECK_THAT(err(R"({"version": 1, "collectives": [{"kind": "all_reduce", "members": 2,
                     "bytes": 1, "busbw_GBps": 1, "transport": "tcp"}]})"),
             Catch::Contains("'transport' must be"));
}
