#include "engine/plan/fp8_recipe.h"

#include "engine/memory/memory_model.h"
#include "engine/plan/mesh.h"
#include "engine/plan/segment_plan.h"

namespace meshtrain {

Status check_fp8_device(const sim::DeviceSpec& d) {
  if (d.peak_fp8_flops > 0) return ok_status();
  return make_error("precision fp8: device '{}' has no FP8 tensor cores (its fp8_TFLOPS is 0); simulate it "
                    "with --precision bf16, or on a cluster of FP8 devices (--cluster dgx-h100 or h200, or a "
                    "cluster file whose device gives \"fp8_TFLOPS\")",
                    d.name);
}

double fp8_extra_bytes(const ModelSpec& m, const Plan& p, int rank) {
  double extra = 0;
  for (const Plan& s : plan_segments(p)) {
    if (s.precision != Precision::fp8 || !s.holds_rank(rank)) continue;
    Plan bf16 = s;
    bf16.precision = Precision::bf16;
    const int stage = Mesh(s).coord_of(rank).pp;
    extra += memory_per_rank(m, s, stage, meshtrain_layout(s)).total() -
             memory_per_rank(m, bf16, stage, meshtrain_layout(bf16)).total();
  }
  return extra;
}

}  // namespace meshtrain
