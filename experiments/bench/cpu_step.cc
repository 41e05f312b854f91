// One training step of a model on the cpu backend, in GFLOP/s against the
// backend's own SGEMM rate (1024^3, tiled over all its threads) measured in
// the same run. The backend uses every core this process may use: pin it
// (taskset -c 0) for the single-core figures.
//
//   bench_cpu_step [model] [batch] [seq]      default: gpt2-124m 4 64
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "engine/step/training_engine.h"
#include "models/flops.h"

using namespace meshtrain;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double sgemm_gflops(CpuBackend& b, int n, int reps) {
  Tensor a = b.empty(Shape{n, n}), c = b.empty(Shape{n, n});
  b.fill(a, 0.5f);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    b.gemm(a, a, c, GemmOp{});
    (void)b.synchronize();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 2.0 * n * n * n / median(t) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "gpt2-124m";
  const int batch = argc > 2 ? std::stoi(argv[2]) : 4, seq = argc > 3 ? std::stoi(argv[3]) : 64;
  auto model = model_preset(name);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.error().message().c_str());
    return 1;
  }
  Plan plan;
  plan.micro_batch = batch;
  plan.seq_len = seq;
  plan.precision = Precision::fp32;
  CpuBackend b;
  const double bound = sgemm_gflops(b, 1024, 7);
  TrainingEngine engine(b, *model, plan, StepOptions{});
  HostBatch mb;
  mb.batch = batch, mb.seq = seq;
  for (int i = 0; i < batch * seq; ++i) {
    mb.ids.push_back((i * 7919) % model->vocab);
    mb.targets.push_back((i * 104729 + 1) % model->vocab);
  }
  std::vector<double> times;
  for (int step = 1; step <= 4; ++step) {
    const auto t0 = Clock::now();
    auto r = engine.step({mb}, 1e-4f, step);
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", r.error().message().c_str());
      return 1;
    }
    if (step > 1) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());  // step 1 warms up
  }
  const double flops = training_flops(*model, batch, seq, Recompute::none).model;
  const double achieved = flops / median(times) / 1e9;
  std::printf("model %s, B=%d T=%d: step %.3f s (median of %zu), %.1f GFLOP/s model FLOPs\n", name.c_str(), batch,
              seq, median(times), times.size(), achieved);
  std::printf("SGEMM 1024^3 on %d thread(s) (same run): %.1f GFLOP/s\n", b.threads(), bound);
  std::printf("ratio step / SGEMM bound: %.2f\n", achieved / bound);
  return 0;
}
