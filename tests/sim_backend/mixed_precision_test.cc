// A bf16 plan through StepEngine on sim backends: the engine issues 16-bit
// activations and working weights (fp32 gradients, masters and AdamW state),
// so the measured per-stage peak matches the analytic memory model at bf16
// (meshtrain's layout), and the bytes each collective kind moves match counts
// derived by hand from the model: tensor-parallel all-reduces and pipeline
// sends carry 2-byte activations, ZeRO's gradient reduce-scatter is fp32 and
// its parameter all-gather 16-bit. With the plan's gradients in bf16
// (GradDtype::bf16, Megatron-Core's grad_reduce_in_fp32 false) the gradient
// buffers, their reduce-scatter and the tied embedding's gradient all-reduce
// move 2 bytes an element, and the memory model follows.
#include <catch2/catch.hpp>

#include <string>

#include "engine/memory/memory_model.h"
#include "engine/simulation/simulation.h"
#include "models/parameters.h"
#include "tests/sim_backend/sim_testing.h"

using namespace meshtrain;
using namespace meshtrain::sim_testing;

namespace {


Plan bf16_plan(const ModelSpec& m, ScheduleKind s, GradDtype grads = GradDtype::fp32) {
  Plan p;
  p.grad_dtype = grads;
  p.tp = 2, p.pp = 2, p.dp = 2, p.zero = 1;
  p.micro_batch = 2;
  p.global_batch = 2 * 2 * 4;  // m = 4 per replica
  p.schedule = s;
  p.precision = Precision::bf16;
  return checked(p, m);
}

SimulationResult simulate(const ModelSpec& m, const Plan& p) { return simulated(m, p, on_cluster("dgx-a100")); }

double bytes_of(const SimulationResult& r, sim::CollectiveKind k) {
  return r.collectives[static_cast<std::size_t>(k)].bytes;
}

}  // namespace

TEST_CASE("bf16 plan: per-stage peak memory matches the memory model at bf16", "[sim_backend][memory][bf16]") {
  const ModelSpec m = small_gpt();
  for (ScheduleKind s : {ScheduleKind::one_f_one_b, ScheduleKind::gpipe}) {
    const Plan p = bf16_plan(m, s);
    const SimulationResult r = simulate(m, p);
    REQUIRE(r.stages.size() == 2);
    for (const StageResult& st : r.stages) {
      const MemoryBreakdown& model = st.model;
      INFO(schedule_name(s) << " stage " << st.stage << ": measured " << st.peak_bytes << " B, model " << model.total()
                            << " B (parameters " << model.parameters << ", gradients " << model.gradients
                            << ", optimizer " << model.optimizer << ", activations " << model.activations << ")");
      CHECK(static_cast<double>(st.peak_bytes) == Approx(model.total()).epsilon(0.10));
      // The same plan's states at fp32 would be (4 + 4 + 8/dp + 4/dp)/(2 + 4 + 12/dp + 4/dp) = 1.4× larger:
      // a 10% bound tells the precisions apart.
    }
  }
}

TEST_CASE("bf16 plan: collective bytes are those of 16-bit activations and fp32 or bf16 gradients",
          "[sim_backend][comm][bf16]") {
  const ModelSpec m = small_gpt();
  for (const GradDtype grads : {GradDtype::fp32, GradDtype::bf16}) {
    INFO("gradients " << grad_dtype_name(grads));
    const Plan p = bf16_plan(m, ScheduleKind::one_f_one_b, grads);
    const SimulationResult r = simulate(m, p);
    const int mb = p.microbatches(), per_stage = m.layers / p.pp;
    const double N = static_cast<double>(p.micro_batch) * m.seq_len, C = m.hidden, act = 2;  // bf16
    const double grad = grads == GradDtype::bf16 ? 2 : 4;
    // Per micro-batch: every layer all-reduces two (N, C) outputs in forward and two input gradients in
    // backward; the embedding one output (stage 0), the head one input gradient and three fp32 row
    // statistics (stage 1). Once per iteration, the tied embedding's gradient shard ((V padded)/tp, C)
    // is all-reduced between the two pipeline ends (both simulated: an executor collective).
    const double tied_embedding = static_cast<double>(padded_vocab(m, p.tp)) / p.tp * C * grad;
    const double all_reduce = mb * (2.0 * (4.0 * per_stage) + 2.0) * N * C * act + mb * 3.0 * N * 4 + tied_embedding;
    // Both stages' (B, T, C) activations forward and gradients backward, across one boundary.
    const double send_recv = 2.0 * mb * N * C * act;
    double params = 0;  // this tp rank's parameters on each stage, summed
    for (int stage = 0; stage < p.pp; ++stage)
      params += static_cast<double>(count_shard_parameters(m, p.tp, p.pp, p.vpp, p.ep, stage).total);
    INFO("all_reduce " << bytes_of(r, sim::CollectiveKind::kAllReduce) << " B (expected " << all_reduce
                       << "), send_recv " << bytes_of(r, sim::CollectiveKind::kSendRecv) << " (" << send_recv
                       << "), reduce_scatter " << bytes_of(r, sim::CollectiveKind::kReduceScatter) << " ("
                       << params * grad << "), all_gather " << bytes_of(r, sim::CollectiveKind::kAllGather) << " ("
                       << params * act << ")");
    // 1% rather than 10%: the embedding term is a third of the total, so leaving it out (or counting it
    // at the other gradient dtype) fails.
    CHECK(bytes_of(r, sim::CollectiveKind::kAllReduce) == Approx(all_reduce).epsilon(0.01));
    CHECK(bytes_of(r, sim::CollectiveKind::kSendRecv) == Approx(send_recv).epsilon(0.10));
    // ZeRO-1: gradients reduce-scattered in their dtype, updated parameters all-gathered in bf16.
    CHECK(bytes_of(r, sim::CollectiveKind::kReduceScatter) == Approx(params * grad).epsilon(0.10));
    CHECK(bytes_of(r, sim::CollectiveKind::kAllGather) == Approx(params * act).epsilon(0.10));
  }
}

TEST_CASE("bf16 gradients: the peak drops by 2 bytes a parameter, as the memory model says",
          "[sim_backend][memory][bf16]") {
  // ZeRO 1 keeps the whole gradient buffer on every rank and the reduce-scatter's 1/dp shard of it: fp32 to
  // bf16 frees 2 bytes per parameter of the stage and 2/dp more, in the memory model and in the measured peak.
  const ModelSpec m = small_gpt();
  const Plan fp32 = bf16_plan(m, ScheduleKind::one_f_one_b), bf16 = bf16_plan(m, ScheduleKind::one_f_one_b,
                                                                                GradDtype::bf16);
  const SimulationResult a = simulate(m, fp32), b = simulate(m, bf16);
  REQUIRE(a.stages.size() == b.stages.size());
  for (std::size_t i = 0; i < a.stages.size(); ++i) {
    const StageResult &x = a.stages[i], &y = b.stages[i];
    const double params = static_cast<double>(count_shard_parameters(m, fp32.tp, fp32.pp, fp32.vpp, fp32.ep,
                                                                      x.stage).total);
    INFO("stage " << x.stage << ": peak " << x.peak_bytes << " B with fp32 gradients, " << y.peak_bytes
                  << " B with bf16; " << params << " parameters");
    CHECK(y.model.gradients == Approx(x.model.gradients / 2));
    const double freed = 2 * params + 2 * params / fp32.dp;
    CHECK(static_cast<double>(y.model.total()) == Approx(x.model.total() - freed).epsilon(1e-9));
    CHECK(static_cast<double>(x.peak_bytes - y.peak_bytes) == Approx(freed).epsilon(0.01));
    CHECK(static_cast<double>(y.peak_bytes) == Approx(y.model.total()).epsilon(0.10));
  }
}

TEST_CASE("bf16 gradients under ZeRO 2 and 3 and with the optimizer offloaded: half the reduce-scatter bytes",
          "[sim_backend][comm][bf16]") {
  // The same elements cross the wire in every layout (ZeRO 2/3 reduce each layer's gradients per micro-batch,
  // ZeRO 1 once per step), so bf16 gradients halve the reduce-scatter's bytes exactly; the parameters'
  // all-gathers do not change. Offload widens each reduced bf16 shard to the host's fp32 on the way down.
  const ModelSpec m = small_gpt();
  struct Layout {
    int zero;
    Offload offload;
  };
  for (const Layout l : {Layout{2, Offload::none}, Layout{3, Offload::none}, Layout{1, Offload::optimizer},
                         Layout{3, Offload::params}}) {
    INFO("zero " << l.zero << ", offload " << offload_name(l.offload));
    auto plan = [&](GradDtype grads) {
      Plan p = bf16_plan(m, ScheduleKind::one_f_one_b, grads);
      p.zero = l.zero;
      p.offload = l.offload;
      return checked(p, m);
    };
    const SimulationResult fp32 = simulate(m, plan(GradDtype::fp32)), bf16 = simulate(m, plan(GradDtype::bf16));
    CHECK(bytes_of(bf16, sim::CollectiveKind::kReduceScatter) ==
          Approx(bytes_of(fp32, sim::CollectiveKind::kReduceScatter) / 2).epsilon(1e-9));
    CHECK(bytes_of(bf16, sim::CollectiveKind::kAllGather) ==
          Approx(bytes_of(fp32, sim::CollectiveKind::kAllGather)).epsilon(1e-9));
    CHECK(bf16.iteration_s <= fp32.iteration_s);
  }
}
