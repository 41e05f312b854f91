// Precision fp8 as exact emulation (engine/fp8_training.h): every plan
// computes what the single-rank fp8 run computes, to the tolerance the fp32
// plans meet (tests/parallel/parallel_check.h), because each FP8 tensor's
// amax is reduced over the ranks that hold its parts before it sets a scale;
// the emulation is really applied (the fp8 losses are not the fp32 ones) and
// stays close to fp32; and a run continued from its exported state (what a
// checkpoint keeps) gives the uninterrupted run's bits.
#include <catch2/catch.hpp>

#include <cmath>

#include "tests/parallel/parallel_check.h"

using namespace meshtrain;
using namespace meshtrain::testing;

namespace {

StepOptions fp8_options() {
  StepOptions o = step_options();
  o.emulate_fp8 = true;
  return o;
}

Plan fp8_plan(int tp, int pp, int dp, int zero, ScheduleKind schedule) {
  Plan p = make_plan(tp, pp, dp, zero, schedule);
  p.precision = Precision::fp8;
  return p;
}

const PlanRun& fp8_reference(const ModelSpec& m) {
  static std::map<std::string, PlanRun> cache;
  auto it = cache.find(m.name);
  if (it == cache.end())
    it = cache.emplace(m.name, run_plan(m, fp8_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b), 0, fp8_options())).first;
  return it->second;
}

void check_fp8_matches(const ModelSpec& m, const Plan& p) { check_matches(m, p, fp8_reference(m), fp8_options()); }

}  // namespace

TEST_CASE("fp8: tensor, data and pipeline parallel plans match the single-rank fp8 run", "[parallel][fp8]") {
  for (const ModelSpec& m : {tiny_gpt(), tiny_llama()}) {
    check_fp8_matches(m, fp8_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b));
    check_fp8_matches(m, fp8_plan(1, 1, 2, 1, ScheduleKind::one_f_one_b));
    check_fp8_matches(m, fp8_plan(1, 2, 1, 0, ScheduleKind::one_f_one_b));
  }
}

TEST_CASE("fp8: hybrid plans (tp2 pp2 dp2, sequence and context parallel) match the single-rank fp8 run",
          "[parallel][fp8][hybrid]") {
  check_fp8_matches(tiny_gpt(), fp8_plan(2, 2, 2, 2, ScheduleKind::one_f_one_b));
  Plan sp = fp8_plan(2, 2, 2, 3, ScheduleKind::gpipe);
  sp.sequence_parallel = true;
  check_fp8_matches(tiny_llama(), sp);
  Plan cp = fp8_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b);
  cp.cp = 2;
  check_fp8_matches(tiny_llama(), cp);
}

TEST_CASE("fp8: the emulation changes the losses, which stay close to fp32's", "[parallel][fp8]") {
  for (const ModelSpec& m : {tiny_gpt(), tiny_llama()}) {
    INFO(m.name);
    const RankRun& fp8 = fp8_reference(m).ranks[0];
    const RankRun& fp32 = reference(m).ranks[0];
    for (int s = 0; s < kSteps; ++s) {
      INFO("step " << s + 1);
      // Step 1 quantizes with scale 1: weights of N(0, 0.02) keep 2-3 significant bits in E4M3, so the
      // logits move by far more than fp32 rounding (1e-7) would; yet the loss is within 1%.
      const double rel = std::abs(fp8.losses[s] - fp32.losses[s]) / fp32.losses[s];
      CHECK(rel > 1e-5);
      CHECK(rel < 1e-2);
    }
    // The scaling state is in the exported state (a checkpoint's), one tensor per FP8 linear.
    CHECK(fp8.state.count("fp8/layers.0.attn.qkv") == 1);
    CHECK(fp8.state.count("fp8/layers.1.mlp.down") == 1);
    CHECK(fp32.state.count("fp8/layers.0.attn.qkv") == 0);
  }
}

TEST_CASE("fp8: a run resumed from its exported state continues bit for bit", "[parallel][fp8][resume]") {
  const ModelSpec m = tiny_gpt();
  const StepOptions options = fp8_options();
  // Saved under tp 2, resumed single-rank and under tp 2: the state does not depend on the plan.
  for (const Plan& resume_plan : {fp8_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b),
                                  fp8_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b)}) {
    INFO("resumed under " << describe(resume_plan));
    const Plan saved_plan = fp8_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b);
    auto train = [&](const Plan& p, int first, int last, const std::map<std::string, std::vector<float>>* from,
                     std::map<std::string, std::vector<float>>& state, std::vector<double>& losses) {
      std::vector<std::map<std::string, std::vector<float>>> states(static_cast<std::size_t>(p.world_size()));
      std::vector<std::vector<double>> rank_losses(states.size());
      const Status s = run_ranks(p.world_size(), [&](int rank, Communicator& comm) -> Status {
        CpuBackend b(comm, CpuBackendOptions{1});
        const auto engine = make_engine(b, m, p, options);
        if (from) MT_TRY(engine->import_state(*from));
        for (int step = first; step <= last; ++step) {
          MT_ASSIGN(StepResult r, engine->step(global_batch(m, step), 1e-2f, step));
          rank_losses[static_cast<std::size_t>(rank)].push_back(r.loss);
        }
        MT_ASSIGN(states[static_cast<std::size_t>(rank)], engine->export_state());
        return ok_status();
      });
      INFO((s.ok() ? std::string() : s.error().message()));
      REQUIRE(s.ok());
      state = states[0];
      losses = rank_losses[0];
    };
    std::map<std::string, std::vector<float>> once, half, twice;
    std::vector<double> losses_once, first_half, second_half;
    train(resume_plan, 1, 4, nullptr, once, losses_once);
    train(saved_plan, 1, 2, nullptr, half, first_half);
    train(resume_plan, 3, 4, &half, twice, second_half);
    if (resume_plan.tp == 2) {
      // Same plan throughout: every bit of the losses, parameters, moments and FP8 state.
      CHECK(second_half == std::vector<double>(losses_once.begin() + 2, losses_once.end()));
      CHECK(twice == once);
    } else {
      for (std::size_t i = 0; i < 2; ++i) CHECK(second_half[i] == Approx(losses_once[i + 2]).epsilon(1e-5));
    }
  }
}
