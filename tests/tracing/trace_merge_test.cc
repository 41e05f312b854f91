// trace_merge.h: per-rank events and clock offsets in, one Chrome trace out.
// The expected times are worked by hand from the events' own-clock times and
// the offsets (common time = own time + offset), in microseconds.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "engine/tracing/trace_merge.h"
#include "tests/training/error_of.h"

using namespace meshtrain;
using testing::error_of;
using nlohmann::json;

namespace {

TraceEvent op(int stream, const char* name, const char* category, std::int64_t start_ns, std::int64_t duration_ns,
              bool device_clock = false) {
  return TraceEvent{.stream = stream,
                    .name = name,
                    .category = category,
                    .start_ns = start_ns,
                    .duration_ns = duration_ns,
                    .device_clock = device_clock};
}

RankTrace rank_trace(int rank, std::vector<TraceEvent> events) {
  RankTrace t;
  t.label = "rank " + std::to_string(rank) + " (cpu)";
  t.streams = {{0, "compute"}, {1, "comm"}};
  for (const TraceEvent& e : events) t.add(e, e.stream == 1 ? R"({"peer":7})" : "");
  return t;
}

// Rank 0 sends at 1.000 µs for 0.5 µs on its clock; rank 1's clock runs
// 1.5 µs ahead of rank 0's, so its recv from 2.4 µs to 3.4 µs on its own
// clock is 0.9 µs to 1.9 µs on rank 0's; its gemm at 1.0 µs is at -0.5 µs.
std::map<int, RankTrace> two_ranks() {
  return {{0, rank_trace(0, {op(1, "send", "send", 1000, 500), op(0, "gemm", "compute", 2000, 300)})},
          {1, rank_trace(1, {op(0, "gemm", "compute", 1000, 250), op(1, "recv", "recv", 2400, 1000, true)})}};
}
const std::map<int, ClockOffset> kClocks = {{0, {0, 0}}, {1, {-1500, 200}}};

}  // namespace

TEST_CASE("merged ranks: metadata first, then each rank's events on the common base", "[trace]") {
  const std::string text = merged_trace_json(two_ranks(), kClocks);
  const json trace = json::parse(text);
  const json& ev = trace.at("traceEvents");
  REQUIRE(ev.size() == 2 * 3 + 4);  // per rank: process_name, two thread_names; four ops
  CHECK(ev[0].at("name") == "process_name");
  CHECK(ev[0].at("pid") == 0);
  CHECK(ev[0].at("args") == json{{"name", "rank 0 (cpu)"}, {"clock_offset_ns", 0}, {"clock_uncertainty_ns", 0}});
  CHECK(ev[3].at("pid") == 1);
  CHECK(ev[3].at("args") ==
        json{{"name", "rank 1 (cpu)"}, {"clock_offset_ns", -1500}, {"clock_uncertainty_ns", 200}});
  CHECK(ev[5].at("name") == "thread_name");
  CHECK(ev[5].at("args").at("name") == "comm");
  // Events: rank 0's send, gemm; rank 1's gemm, recv.
  CHECK(ev[6].at("name") == "send");
  CHECK(ev[6].at("ts").get<double>() == Approx(1.0));
  CHECK(ev[7].at("ts").get<double>() == Approx(2.0));
  CHECK(ev[8].at("pid") == 1);
  CHECK(ev[8].at("ts").get<double>() == Approx(-0.5));
  CHECK(ev[8].at("dur").get<double>() == Approx(0.25));
  CHECK(ev[9].at("name") == "recv");
  CHECK(ev[9].at("ts").get<double>() == Approx(0.9));
  CHECK(ev[9].at("args") == json{{"peer", 7}, {"clock", "device"}});
  // The recv ends (1.9 µs) after the send began (1.0 µs), as it must.
  CHECK(ev[9].at("ts").get<double>() + ev[9].at("dur").get<double>() > ev[6].at("ts").get<double>());
  // Nanoseconds printed exactly, the sign on the whole number.
  CHECK_THAT(text, Catch::Contains(R"("ts":-0.500,"dur":0.250)"));
  CHECK_THAT(text, Catch::Contains(R"("ts":0.900,"dur":1.000)"));
}

TEST_CASE("ranks of one clock say nothing of offsets", "[trace]") {
  const json trace = json::parse(merged_trace_json(two_ranks(), {}));
  const json& ev = trace.at("traceEvents");
  CHECK(ev[0].at("args") == json{{"name", "rank 0 (cpu)"}});
  CHECK(ev[8].at("ts").get<double>() == Approx(1.0));  // rank 1's gemm unmoved
}

TEST_CASE("fragments packed, shipped in any order and merged give the same file", "[trace]") {
  const auto ranks = two_ranks();
  std::string shipped_1 = pack_fragments({render_rank_trace(1, ranks.at(1), kClocks.at(1), true)});
  std::string shipped_0 = pack_fragments({render_rank_trace(0, ranks.at(0), kClocks.at(0), true)});
  std::vector<TraceFragment> got;
  for (const std::string* packed : {&shipped_1, &shipped_0}) {
    auto unpacked = unpack_fragments(*packed);
    REQUIRE(unpacked.ok());
    for (TraceFragment& f : *unpacked) got.push_back(std::move(f));
  }
  REQUIRE(got.size() == 2);
  CHECK(got[0].rank == 1);
  CHECK(merge_fragments(got) == merged_trace_json(ranks, kClocks));
}

TEST_CASE("a rank with no events still has its row", "[trace]") {
  const json trace = json::parse(merge_fragments({render_rank_trace(2, rank_trace(2, {}), {}, false)}));
  REQUIRE(trace.at("traceEvents").size() == 3);
  CHECK(trace.at("traceEvents")[0].at("args").at("name") == "rank 2 (cpu)");
}

TEST_CASE("a malformed packed fragment is an error naming the fault", "[trace]") {
  const std::string good = pack_fragments({{3, "{\"a\":1}", "{\"b\":2}"}});
  CHECK(unpack_fragments(good).ok());
  CHECK_THAT(error_of(unpack_fragments("3 7")), Catch::Contains("header has no end"));
  CHECK_THAT(error_of(unpack_fragments("3 x 7\n")), Catch::Contains("is not three counts"));
  CHECK_THAT(error_of(unpack_fragments(good.substr(0, good.size() - 1))),
                   Catch::Contains("rank 3's packed trace fragment holds 13 bytes, its header says 14"));
}
