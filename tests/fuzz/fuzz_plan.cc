// Fuzz target: the plan file reader (engine/plan/plan.h), then the merge with
// defaults and the validation every command runs on an accepted plan; a
// "segments" list is resolved on models with modules (Swin, VQA) and a decoder
// (engine/plan/segment_plan.h), as resolve_model_and_plan does.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/json_input.h"
#include "engine/plan/plan.h"
#include "engine/plan/segment_plan.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace meshtrain;
  auto j = parse_json(meshtrain::fuzz::fuzz_text(data, size), "fuzz plan");
  if (!j.ok()) return 0;
  auto o = plan_overrides_from_json(*j);
  if (!o.ok()) return 0;
  auto p = apply_overrides(Plan{}, *o);
  if (!p.ok()) return 0;
  static const ModelSpec tiny = model_preset("tiny").value();
  static const ModelSpec big = model_preset("llama3-405b").value();
  static const ModelSpec swin = model_preset("swin-fmnist").value();
  static const ModelSpec vqa = model_preset("vqa-tiny").value();
  for (const ModelSpec* m : {&tiny, &big, &swin, &vqa}) {
    Plan plan = *p;
    if (o->segments) {
      auto segments = segments_from_json(*o->segments, *m, plan);
      if (!segments.ok()) continue;
      plan.segments = std::move(segments).value();
    }
    if (validate_plan(plan, *m).ok()) (void)plan_to_json(plan).dump();
  }
  return 0;
}
