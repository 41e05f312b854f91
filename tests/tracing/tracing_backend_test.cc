// TracingBackend over the cpu backend, ranks as threads: every traced op
// becomes one complete event of its rank on its stream's track, with shapes
// and bytes, and the recorder collects the ranks' events safely.
#include <catch2/catch.hpp>

#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cpu/comm/in_process.h"
#include "backends/cpu/cpu_backend.h"
#include "engine/tracing/tracing_backend.h"

using namespace meshtrain;
using nlohmann::json;

namespace {

// Each rank: two writes, a gemm (4, 8)·(8, 3) on the compute stream, an
// all-reduce of the product on a "comm" stream, a read.
Status traced_work(Backend& inner, TraceRecorder& recorder) {
  TracingBackend b(inner, recorder);
  Tensor a = b.empty({4, 8}), w = b.empty({8, 3}), c = b.empty({4, 3});
  b.write(a, std::vector<float>(32, 1.0f));
  b.write(w, std::vector<float>(24, 0.5f));
  b.gemm(a, w, c, GemmOp{});
  const Stream comm = b.create_stream("comm");
  b.wait(comm, b.record(b.current_stream()));
  {
    StreamScope on_comm(b, comm);
    b.all_reduce(c, Group{0, {0, 1}}, ReduceOp::sum);
  }
  std::vector<float> host(12);
  return b.read(c, host);
}

}  // namespace

TEST_CASE("two thread ranks trace into one recorder", "[trace]") {
  TraceRecorder recorder;
  REQUIRE(run_ranks(2, [&](int, Communicator& comm) {
            CpuBackend cpu(comm);
            return traced_work(cpu, recorder);
          }).ok());
  const json trace = json::parse(recorder.to_json());
  std::vector<json> meta, events;
  for (const json& e : trace.at("traceEvents")) (e.at("ph") == "M" ? meta : events).push_back(e);
  // Per rank: its name, then its two tracks.
  REQUIRE(meta.size() == 6);
  CHECK(meta[0].at("args").at("name") == "rank 0 (cpu)");
  CHECK(meta[1].at("args").at("name") == "compute");
  CHECK(meta[2].at("tid") == 1);
  CHECK(meta[2].at("args").at("name") == "comm");
  CHECK(meta[3].at("args").at("name") == "rank 1 (cpu)");
  REQUIRE(events.size() == 10);
  const std::vector<std::string> names = {"write", "write", "gemm", "all_reduce", "read"};
  // Bytes: (32 + 24 + 12) floats for the gemm, the 12-float buffer for the all-reduce.
  const json gemm_args = json::parse(R"json({"shapes":["(4, 8)","(8, 3)","(4, 3)",null],"bytes":272})json");
  const json reduce_args = json::parse(R"json({"shapes":["(4, 3)"],"bytes":48,"group":0,"members":2})json");
  for (int rank = 0; rank < 2; ++rank) {
    double last = -1;
    for (int i = 0; i < 5; ++i) {
      const json& e = events[static_cast<std::size_t>(rank * 5 + i)];
      INFO("rank " << rank << " event " << e.dump());
      CHECK(e.at("pid") == rank);
      CHECK(e.at("name") == names[static_cast<std::size_t>(i)]);
      CHECK(e.at("ts").get<double>() >= last);
      last = e.at("ts").get<double>() + e.at("dur").get<double>();
    }
    const json& gemm = events[static_cast<std::size_t>(rank * 5 + 2)];
    CHECK(gemm.at("cat") == "compute");
    CHECK(gemm.at("tid") == 0);
    CHECK(gemm.at("args") == gemm_args);
    const json& reduce = events[static_cast<std::size_t>(rank * 5 + 3)];
    CHECK(reduce.at("cat") == "all_reduce");
    CHECK(reduce.at("tid") == 1);
    CHECK(reduce.at("args") == reduce_args);
    CHECK(events[static_cast<std::size_t>(rank * 5 + 4)].at("tid") == 0);  // the scope restored stream 0
  }
}

TEST_CASE("a trace path that cannot be written is an error naming it", "[trace]") {
  const std::string dir = std::filesystem::temp_directory_path().string();
  auto s = TraceRecorder::probe(dir);  // a directory, not a file
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error().message(), Catch::Contains("trace file '" + dir + "' is a directory"));
}
