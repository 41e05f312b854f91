// The check every parallel numerics test makes: a plan's losses, gradient
// norms, evaluation and final parameters against the single-rank run of the
// same model (cached per model), ranks as threads.
#pragma once

#include <catch2/catch.hpp>
#include <fmt/ranges.h>

#include <map>
#include <mutex>
#include <string>

#include "backends/cpu/comm/in_process.h"
#include "backends/cpu/threads.h"
#include "tests/parallel/parallel_harness.h"
#include "tests/segmented_plan.h"

namespace meshtrain::testing {

struct PlanRun {
  std::vector<RankRun> ranks;
};

// `threads` per rank; 0: the cores shared out among the ranks, as `meshtrain train` does.
inline PlanRun run_plan(const ModelSpec& m, Plan p, int threads = 0, const StepOptions& options = step_options()) {
  if (m.vision()) p.seq_len = 0;  // the images fix the tokens
  PlanRun out;
  out.ranks.resize(static_cast<std::size_t>(p.world_size()));
  REQUIRE(validate_plan(p, m).ok());
  const int per_rank = threads > 0 ? threads : cpu::threads_per_rank(p.world_size());
  const Status s = run_ranks(p.world_size(), [&](int rank, Communicator& comm) -> Status {
    CpuBackend b(comm, CpuBackendOptions{per_rank});
    return run_rank(b, m, p, out.ranks[static_cast<std::size_t>(rank)], options);
  });
  INFO((s.ok() ? std::string() : s.error().message()));
  REQUIRE(s.ok());
  return out;
}

inline const PlanRun& reference(const ModelSpec& m) {
  static std::map<std::string, PlanRun> cache;
  static std::mutex mu;
  std::lock_guard lock(mu);
  auto it = cache.find(m.name);
  if (it == cache.end()) it = cache.emplace(m.name, run_plan(m, make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b))).first;
  return it->second;
}

inline std::string describe(const Plan& p) {
  if (!p.segments.empty()) {
    std::string out = "segments:";
    for (const Plan& s : p.segments)
      out += fmt::format(" [layers {}+{}{}{} ranks {}.. tp{} pp{} dp{} m{} zero{}{}]", s.first_layer, s.layers,
                         s.embedding ? " embed" : "", s.head ? " head" : "", s.first_rank, s.tp, s.pp, s.dp,
                         s.microbatches(), s.zero, s.sequence_parallel ? " sp" : "");
    return out;
  }
  return fmt::format("tp{} pp{} dp{} vpp{} zero{} {}{} stages first {} last {} buckets {:g} MiB {}{}", p.tp, p.pp,
                     p.dp, p.vpp, p.zero, schedule_name(p.schedule), p.sequence_parallel ? " sp" : "",
                     p.first_stage_layers, p.last_stage_layers, p.grad_bucket_mb, grad_sync_name(p.grad_sync),
                     p.ep > 1 || p.etp > 0 ? fmt::format(" ep{} etp{}", p.ep, p.expert_tp()) : "") +
         (p.cp > 1 ? fmt::format(" cp{} {}", p.cp, context_comm_name(p.cp_comm)) : "") +
         (p.chunk_layers.empty() ? "" : fmt::format(" chunks {}", fmt::join(p.chunk_layers, ","))) +
         (p.embedding_in_split ? " embedding-in-split" : "") + (p.loss_in_split ? " loss-in-split" : "");
}

// `p`'s run with `options` against `ref`, the single-rank run of the same
// model, precision and options. Parameters, and the FP8 scaling state of an
// fp8 run, within 1e-5 of the reference's (relative_error).
inline void check_matches(const ModelSpec& m, const Plan& p, const PlanRun& ref, const StepOptions& options) {
  INFO("seed " << kSeed << ", plan " << describe(p) << ", model " << m.name);
  const PlanRun run = run_plan(m, p, 0, options);
  const RankRun& r0 = ref.ranks[0];
  for (const RankRun& r : run.ranks) {
    // Every rank reports the same loss and norm bits.
    CHECK(r.losses == run.ranks[0].losses);
    CHECK(r.grad_norms == run.ranks[0].grad_norms);
    CHECK(r.eval_loss == run.ranks[0].eval_loss);
  }
  CHECK(run.ranks[0].eval_loss == Approx(r0.eval_loss).epsilon(1e-5));
  for (int s = 0; s < kSteps; ++s) {
    INFO("step " << s + 1);
    CHECK(run.ranks[0].losses[s] == Approx(r0.losses[s]).epsilon(1e-5));
    CHECK(run.ranks[0].grad_norms[s] == Approx(r0.grad_norms[s]).epsilon(1e-5));
  }
  REQUIRE(run.ranks[0].state.size() == r0.state.size());
  double worst = 0;
  for (const auto& [name, ref_values] : r0.state) {
    if (!name.starts_with("params/") && !name.starts_with("fp8/")) continue;
    INFO(name);
    auto it = run.ranks[0].state.find(name);
    REQUIRE(it != run.ranks[0].state.end());
    REQUIRE(it->second.size() == ref_values.size());
    const double e = relative_error(it->second, ref_values);
    worst = std::max(worst, e);
    CHECK(e <= 1e-5);
  }
  WARN(describe(p) << ": worst relative parameter error " << worst);
}

inline void check_matches_reference(const ModelSpec& m, const Plan& p) {
  check_matches(m, p, reference(m), step_options());
}

// Two runs that must hold the same bits (their plans differ only in what runs
// when, or in what they keep and recompute): every rank's losses, gradient
// norms and evaluation loss, and rank 0's final state, equal, not merely close.
inline void check_same_bits(const PlanRun& a, const PlanRun& b) {
  REQUIRE(a.ranks.size() == b.ranks.size());
  for (std::size_t r = 0; r < a.ranks.size(); ++r) {
    INFO("rank " << r);
    CHECK(a.ranks[r].losses == b.ranks[r].losses);
    CHECK(a.ranks[r].grad_norms == b.ranks[r].grad_norms);
    CHECK(a.ranks[r].eval_loss == b.ranks[r].eval_loss);
  }
  CHECK(!a.ranks[0].state.empty());
  CHECK(a.ranks[0].state == b.ranks[0].state);
}

// `p` and `q` run on `m` with `options`: the same bits.
inline void check_same_bits(const ModelSpec& m, const Plan& p, const Plan& q,
                            const StepOptions& options = step_options()) {
  INFO("plan " << describe(p) << ", model " << m.name);
  check_same_bits(run_plan(m, p, 0, options), run_plan(m, q, 0, options));
}

// A plan of the given "segments" (tests/segmented_plan.h) over the single-rank plan.
inline Plan segmented(const ModelSpec& m, const char* segments) {
  return segmented(m, make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b), segments);
}

}  // namespace meshtrain::testing
