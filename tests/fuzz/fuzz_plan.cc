// Fuzz target: the plan file reader (engine/plan.h), then the merge with
// defaults and the validation every command runs on an accepted plan.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/json_input.h"
#include "engine/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace meshtrain;
  auto j = parse_json(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz plan");
  if (!j.ok()) return 0;
  auto o = plan_overrides_from_json(*j);
  if (!o.ok()) return 0;
  auto p = apply_overrides(Plan{}, *o);
  if (!p.ok()) return 0;
  static const ModelSpec tiny = model_preset("tiny").value();
  static const ModelSpec big = model_preset("llama3-405b").value();
  for (const ModelSpec* m : {&tiny, &big})
    if (validate_plan(*p, *m).ok()) (void)plan_to_json(*p).dump();
  return 0;
}
