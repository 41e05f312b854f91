// TracingBackend over a backend with device timing: each op's event carries
// its device start and duration (DeviceClockBackend's clock, which the test
// chooses), placed on the host clock at its stream's base event, and the
// pairs are read back only where the host waits anyway.
#include <catch2/catch.hpp>

#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cpu/comm/in_process.h"
#include "backends/cpu/cpu_backend.h"
#include "engine/tracing/tracing_backend.h"
#include "tests/tracing/device_clock_backend.h"

using namespace meshtrain;
using meshtrain::testing::DeviceClockBackend;
using nlohmann::json;

namespace {

// Device seconds of the timing events in the order the work below issues
// them: 0 the default stream's base (the probe at construction); 1-2 the
// gemm (3 ms); 3-4 the fill (0.5 ms); 5 the comm stream's base; 6-7 the
// all-reduce (2 ms); 8 the default stream's new base after the read; 9-10
// the second gemm (7.5 ms).
const std::vector<double> kDevice = {0.0, 0.001, 0.004, 0.005, 0.0055, 0.010, 0.011, 0.013, 0.020, 0.021, 0.0285};

// Writes, a gemm and a fill on the default stream, an all-reduce on "comm",
// a read, then a gemm that only the destruction reads back.
Status work(Backend& b) {
  Tensor a = b.empty({4, 8}), w = b.empty({8, 3}), c = b.empty({4, 3});
  b.write(a, std::vector<float>(32, 1.0f));
  b.write(w, std::vector<float>(24, 0.5f));
  b.gemm(a, w, c, GemmOp{});
  b.fill(a, 2.0f);
  const Stream comm = b.create_stream("comm");
  b.wait(comm, b.record(b.current_stream()));
  {
    StreamScope on_comm(b, comm);
    b.all_reduce(c, Group{0, {0}}, ReduceOp::sum);
  }
  std::vector<float> host(12);
  MT_TRY(b.read(c, host));
  b.gemm(a, w, c, GemmOp{});
  return ok_status();
}

double us(double seconds) { return seconds * 1e6; }

}  // namespace

TEST_CASE("a device backend's ops are traced with their device times", "[trace]") {
  TraceRecorder recorder;
  std::int64_t blocking_traced = 0, blocking_plain = 0, timings_read = 0;
  REQUIRE(run_ranks(1, [&](int, Communicator& comm) -> Status {
            CpuBackend cpu(comm);
            auto clock = [](std::int64_t i) { return kDevice.at(static_cast<std::size_t>(i)); };
            {
              DeviceClockBackend plain(cpu, clock);
              MT_TRY(work(plain));
              blocking_plain = plain.blocking();
            }
            DeviceClockBackend counted(cpu, clock);
            {
              TracingBackend traced(counted, recorder);
              MT_TRY(work(traced));
              // Everything traced but the last gemm was read back after the read, without a wait.
              blocking_traced = counted.blocking();
            }
            timings_read = counted.timings_read();
            if (counted.timed_events() != static_cast<std::int64_t>(kDevice.size()))
              return make_error("{} timing events, expected {}", counted.timed_events(), kDevice.size());
            return ok_status();
          }).ok());
  // Tracing adds no wait: the one read blocks, with it and without.
  CHECK(blocking_plain == 1);
  CHECK(blocking_traced == 1);
  CHECK(timings_read == 8);  // start and end of 4 device ops, each from its base

  const json trace = json::parse(recorder.to_json());
  std::vector<json> events;
  for (const json& e : trace.at("traceEvents"))
    if (e.at("ph") == "X") events.push_back(e);
  REQUIRE(events.size() == 7);
  const std::vector<std::string> names = {"write", "write", "gemm", "fill", "all_reduce", "read", "gemm"};
  for (std::size_t i = 0; i < names.size(); ++i) CHECK(events[i].at("name") == names[i]);
  // Host calls keep host time and no clock; the others are the device's.
  for (const std::size_t host : {0, 1, 5}) CHECK_FALSE(events[host].at("args").contains("clock"));
  for (const std::size_t device : {2, 3, 4, 6}) CHECK(events[device].at("args").at("clock") == "device");
  const json& gemm = events[2];
  const json& fill = events[3];
  const json& reduce = events[4];
  const json& read = events[5];
  const json& gemm2 = events[6];
  CHECK(gemm.at("dur").get<double>() == Approx(us(0.003)).margin(0.002));
  CHECK(fill.at("dur").get<double>() == Approx(us(0.0005)).margin(0.002));
  CHECK(reduce.at("dur").get<double>() == Approx(us(0.002)).margin(0.002));
  CHECK(gemm2.at("dur").get<double>() == Approx(us(0.0075)).margin(0.002));
  // Start times from one base keep the device's gaps: the fill starts 4 ms after the gemm.
  CHECK(fill.at("ts").get<double>() - gemm.at("ts").get<double>() == Approx(us(0.004)).margin(0.002));
  // The comm stream's base was issued (host time) after the gemm and fill, its all-reduce 1 ms after
  // it, as the gemm 1 ms after the default stream's base; the gemm after the read 1 ms after the base
  // issued once the read returned.
  CHECK(reduce.at("ts").get<double>() >= gemm.at("ts").get<double>() - 0.002);
  CHECK(gemm2.at("ts").get<double>() >= read.at("ts").get<double>() + read.at("dur").get<double>() + us(0.001) - 0.002);
  CHECK(reduce.at("tid") != gemm.at("tid"));  // the comm stream's track
  CHECK(reduce.at("args").at("group") == 0);
  CHECK(gemm.at("args").at("bytes") == 272);
}

TEST_CASE("a backend without device timing keeps host times", "[trace]") {
  TraceRecorder recorder;
  REQUIRE(run_ranks(1, [&](int, Communicator& comm) {
            CpuBackend cpu(comm);
            TracingBackend traced(cpu, recorder);
            return work(traced);
          }).ok());
  const json trace = json::parse(recorder.to_json());
  int ops = 0;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    ++ops;
    CHECK_FALSE(e.at("args").contains("clock"));
  }
  CHECK(ops == 7);
}
