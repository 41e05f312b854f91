// Tensor-parallel communication overlap (Plan::tp_comm_overlap): the
// sequence-parallel all-gather before a column-parallel GEMM runs as a ring
// of send/recv pipelined with the GEMM's row blocks. It moves the same rows
// and multiplies them by the same weights; what may change is the cpu GEMM's
// rounding of a row block against the whole product (backends/cpu/kernels/
// gemm.h: OpenBLAS's bits depend on the call's sizes), so runs are compared
// with the 1e-5 relative bound of the other plan checks, and against the
// single-rank run.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <set>

#include "backends/backend_wrapper.h"
#include "tests/parallel/parallel_check.h"

using namespace meshtrain;
using namespace meshtrain::testing;

namespace {

Plan sp(Plan p) {
  p.sequence_parallel = true;
  return p;
}

Plan overlapped(Plan p) {
  p.tp_comm_overlap = true;
  return p;
}

// Four kv heads, so tp 4 divides them.
ModelSpec tiny_llama4() {
  ModelSpec m = tiny_llama();
  m.name = "tiny-llama-kv4";
  m.kv_heads = 4;
  return m;
}

// The run with the option against the run without: every rank's losses, norms, evaluation loss
// and final parameters within 1e-5 relative.
void check_close(const ModelSpec& m, const Plan& base) {
  INFO("seed " << kSeed << ", plan " << describe(base) << ", model " << m.name);
  const PlanRun a = run_plan(m, base), b = run_plan(m, overlapped(base));
  REQUIRE(a.ranks.size() == b.ranks.size());
  for (std::size_t r = 0; r < a.ranks.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(a.ranks[r].losses.size() == b.ranks[r].losses.size());
    for (std::size_t s = 0; s < a.ranks[r].losses.size(); ++s) {
      CHECK(b.ranks[r].losses[s] == Approx(a.ranks[r].losses[s]).epsilon(1e-5));
      CHECK(b.ranks[r].grad_norms[s] == Approx(a.ranks[r].grad_norms[s]).epsilon(1e-5));
    }
    CHECK(b.ranks[r].eval_loss == Approx(a.ranks[r].eval_loss).epsilon(1e-5));
    REQUIRE(a.ranks[r].state.size() == b.ranks[r].state.size());
    for (const auto& [name, values] : a.ranks[r].state) {
      INFO("parameter " << name);
      const std::vector<float>& other = b.ranks[r].state.at(name);
      REQUIRE(values.size() == other.size());
      std::size_t far = 0;
      float worst = 0;  // |Δ| / (1 + |value|)
      for (std::size_t i = 0; i < values.size(); ++i) {
        const float d = std::abs(other[i] - values[i]) / (1.f + std::abs(values[i]));
        worst = std::max(worst, d);
        if (d > 1e-5f) ++far;
      }
      INFO("largest difference " << worst);
      CHECK(far == 0);
    }
  }
}

// One rank's tensor-parallel traffic: all-gathers, ring steps (all-to-alls
// with one peer each way), and the streams the ring steps and GEMMs ran on.
struct TpTraffic {
  int gathers = 0, ring_steps = 0;
  std::set<int> gemm_streams, ring_streams;
};

class TrafficCounter final : public BackendWrapper {
 public:
  TrafficCounter(Backend& b, TpTraffic& out) : BackendWrapper(b), out_(out) {}
  void all_gather(const Tensor& in, Tensor& out, const Group& g) override {
    ++out_.gathers;
    target().all_gather(in, out, g);
  }
  // An FP8 plan's gathers and ring steps count the same (BackendWrapper would pass them on uncounted).
  void all_gather_fp8(const Tensor& in, Tensor& out, const Group& g, std::int64_t fp8_elements) override {
    ++out_.gathers;
    target().all_gather_fp8(in, out, g, fp8_elements);
  }
  void all_to_all(const Tensor& in, std::span<const std::int64_t> send_counts, Tensor& out,
                  std::span<const std::int64_t> recv_counts, const Group& g) override {
    ring_step();
    target().all_to_all(in, send_counts, out, recv_counts, g);
  }
  void all_to_all_fp8(const Tensor& in, std::span<const std::int64_t> send_counts, Tensor& out,
                      std::span<const std::int64_t> recv_counts, const Group& g) override {
    ring_step();
    target().all_to_all_fp8(in, send_counts, out, recv_counts, g);
  }
  void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) override {
    out_.gemm_streams.insert(current_stream().id);
    target().gemm(a, b, c, op);
  }

 private:
  void ring_step() {
    ++out_.ring_steps;
    out_.ring_streams.insert(current_stream().id);
  }
  TpTraffic& out_;
};

// Every rank's traffic over the harness's run: kSteps steps, then one evaluation.
std::vector<TpTraffic> traffic(const ModelSpec& m, const Plan& p) {
  REQUIRE(validate_plan(p, m).ok());
  std::vector<TpTraffic> out(static_cast<std::size_t>(p.world_size()));
  std::vector<RankRun> runs(out.size());
  const Status s = run_ranks(p.world_size(), [&](int rank, Communicator& comm) -> Status {
    CpuBackend b(comm, CpuBackendOptions{1});
    TrafficCounter counted(b, out[static_cast<std::size_t>(rank)]);
    return run_rank(counted, m, p, runs[static_cast<std::size_t>(rank)]);
  });
  INFO((s.ok() ? std::string() : s.error().message()));
  REQUIRE(s.ok());
  return out;
}

}  // namespace

TEST_CASE("tp comm overlap matches the plan without it, GPT and Llama, tp 2 and 4 with pp and dp",
          "[parallel][overlap][tp_overlap]") {
  check_close(tiny_gpt(), sp(make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b)));
  check_close(tiny_gpt(), sp(make_plan(2, 2, 2, 1, ScheduleKind::one_f_one_b)));
  check_close(tiny_gpt(), sp(make_plan(4, 1, 2, 1, ScheduleKind::one_f_one_b)));
  check_close(tiny_gpt(), sp(make_plan(2, 2, 2, 3, ScheduleKind::interleaved, 2)));
  check_close(tiny_gpt(), sp(make_plan(2, 2, 1, 1, ScheduleKind::zb_h1)));  // deferred weight gradients
  check_close(tiny_llama(), sp(make_plan(2, 2, 2, 2, ScheduleKind::gpipe)));
  check_close(tiny_llama4(), sp(make_plan(4, 2, 1, 1, ScheduleKind::one_f_one_b)));
}

// The option must change what is issued, or the comparisons above could not
// fail: each forward column-parallel GEMM (a layer's QKV and MLP-up) trades
// its all-gather for tp-1 ring steps, issued on a stream other than the GEMMs'.
// The head's gather and backward's gathers stay all-gathers. tp 4, so that
// the factor tp-1 is not 1.
TEST_CASE("tp comm overlap replaces each forward column-parallel all-gather by tp-1 ring steps off the GEMMs' stream",
          "[parallel][overlap][tp_overlap]") {
  const ModelSpec m = tiny_gpt();
  const int tp = 4;
  const Plan base = sp(make_plan(tp, 1, 1, 0, ScheduleKind::one_f_one_b));
  INFO(describe(base));
  const std::vector<TpTraffic> plain = traffic(m, base), ring = traffic(m, overlapped(base));
  // Forward passes per rank: kSteps steps of the plan's micro-batches, and the evaluation's.
  const int forwards = (kSteps + 1) * base.microbatches();
  const int replaced = 2 * m.layers * forwards;
  for (int r = 0; r < tp; ++r) {
    INFO("rank " << r);
    const TpTraffic &a = plain[static_cast<std::size_t>(r)], &b = ring[static_cast<std::size_t>(r)];
    CHECK(a.ring_steps == 0);
    CHECK(a.gathers - b.gathers == replaced);
    CHECK(b.ring_steps == (tp - 1) * replaced);
    REQUIRE(b.ring_streams.size() == 1);
    CHECK(!b.gemm_streams.contains(*b.ring_streams.begin()));
  }
}

TEST_CASE("tp comm overlap matches the single-rank run", "[parallel][overlap][tp_overlap]") {
  check_matches_reference(tiny_gpt(), overlapped(sp(make_plan(2, 2, 2, 1, ScheduleKind::one_f_one_b))));
  check_matches_reference(tiny_llama(), overlapped(sp(make_plan(2, 2, 2, 2, ScheduleKind::gpipe))));
}

TEST_CASE("tp comm overlap is refused without tensor and sequence parallelism", "[parallel][overlap][tp_overlap][errors]") {
  const ModelSpec m = tiny_gpt();
  Plan no_tp = sp(make_plan(1, 1, 2, 0, ScheduleKind::one_f_one_b));
  no_tp.tp_comm_overlap = true;
  const Status a = validate_plan(no_tp, m);
  REQUIRE(!a.ok());
  CHECK_THAT(a.error().message(), Catch::Contains("--tp-comm-overlap") && Catch::Contains("tp 1"));
  const Status b = validate_plan(overlapped(make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b)), m);
  REQUIRE(!b.ok());
  CHECK_THAT(b.error().message(),
             Catch::Contains("tp_comm_overlap") && Catch::Contains("without sequence_parallel") &&
                 Catch::Contains("--sequence-parallel"));
  CHECK(validate_plan(overlapped(sp(make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b))), m).ok());
  // A plan file's field must be a boolean.
  auto bad = plan_overrides_from_json(nlohmann::json{{"tp_comm_overlap", "yes"}});
  REQUIRE(!bad.ok());
  CHECK_THAT(bad.error().message(), Catch::Contains("tp_comm_overlap"));
}

TEST_CASE("tp_comm_overlap round-trips through a plan file", "[parallel][overlap][tp_overlap]") {
  const Plan p = overlapped(sp(make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b)));
  const nlohmann::json j = plan_to_json(p);
  CHECK(j.at("tp_comm_overlap") == true);
  CHECK(!plan_to_json(sp(make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b))).contains("tp_comm_overlap"));
  auto o = plan_overrides_from_json(nlohmann::json{{"tp_comm_overlap", j.at("tp_comm_overlap")}});
  REQUIRE(o.ok());
  auto back = apply_overrides(Plan{}, o.value());
  REQUIRE(back.ok());
  CHECK(back.value().tp_comm_overlap);
}
