#include "engine/simulation/goodput.h"

#include <algorithm>
#include <cmath>

namespace meshtrain {

Status check_goodput_inputs(const GoodputInputs& in) {
  auto positive = [](double v) { return v > 0 && std::isfinite(v); };
  if (!positive(in.iteration_s)) return make_error("the iteration time must be > 0 s, got {}", in.iteration_s);
  if (!positive(in.checkpoint_s)) return make_error("the checkpoint write time must be > 0 s, got {}", in.checkpoint_s);
  if (!(in.restart_s >= 0) || !std::isfinite(in.restart_s))
    return make_error("the restart time must be >= 0, got {}", in.restart_s);
  if (!positive(in.job_mtbf_s)) return make_error("the job's MTBF must be > 0 s, got {}", in.job_mtbf_s);
  return ok_status();
}

namespace {

// E[T](τ): the expected wall seconds of τ seconds of work and its checkpoint.
double segment_wall_s(const GoodputInputs& in, double tau) {
  const double M = in.job_mtbf_s;
  // expm1 keeps e^x − 1 exact for the small x of rare failures.
  return M * std::exp(in.restart_s / M) * std::expm1((tau + in.checkpoint_s) / M);
}

}  // namespace

double goodput(const GoodputInputs& in, double tau) { return tau / segment_wall_s(in, tau); }

WallShares wall_shares(const GoodputInputs& in, double tau) {
  const double wall = segment_wall_s(in, tau);
  WallShares s;
  if (!std::isfinite(wall)) {
    s.failures = 1;
    return s;
  }
  s.training = tau / wall;
  s.checkpoints = in.checkpoint_s / wall;
  // E[T] >= τ + C (e^x − 1 >= x, e^{R/M} >= 1): the rest is never negative but for rounding.
  s.failures = std::max(0.0, 1 - s.training - s.checkpoints);
  return s;
}

double optimal_interval_s(const GoodputInputs& in) {
  // f(τ) = 1 − e^{−(τ+C)/M} − τ/M is positive at τ = 0 and negative at τ = M
  // (1 − e^{−1−C/M} < 1), and decreasing: bisect on [0, M].
  const double M = in.job_mtbf_s, C = in.checkpoint_s;
  auto f = [&](double tau) { return -std::expm1(-(tau + C) / M) - tau / M; };
  double lo = 0, hi = M;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * M; ++i) {
    const double mid = 0.5 * (lo + hi);
    (f(mid) > 0 ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

double young_interval_s(const GoodputInputs& in) { return std::sqrt(2 * in.checkpoint_s * in.job_mtbf_s); }

double daly_interval_s(const GoodputInputs& in) {
  const double M = in.job_mtbf_s, C = in.checkpoint_s;
  if (C >= 2 * M) return M;
  const double r = C / (2 * M);
  return std::sqrt(2 * C * M) * (1 + std::sqrt(r) / 3 + r / 9) - C;
}

GoodputPlan at_steps(const GoodputInputs& in, std::int64_t steps) {
  GoodputPlan p;
  p.steps = std::max<std::int64_t>(steps, 1);
  p.interval_s = static_cast<double>(p.steps) * in.iteration_s;
  p.goodput = goodput(in, p.interval_s);
  return p;
}

GoodputPlan optimal_steps(const GoodputInputs& in) {
  // G is unimodal in τ: the best whole step count is next to the continuous optimum.
  const double s = optimal_interval_s(in) / in.iteration_s;
  const auto below = static_cast<std::int64_t>(std::floor(s));
  GoodputPlan a = at_steps(in, below), b = at_steps(in, below + 1);
  return b.goodput > a.goodput ? b : a;
}

}  // namespace meshtrain
