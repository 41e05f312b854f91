#include "engine/calibrate/grouped_grid.h"

#include <cstdint>
#include <utility>
#include <vector>

namespace meshtrain::calibrate {

std::set<GroupedGemmShape> grouped_gemm_grid(bool quick, bool gpu, DType dtype) {
  using Sizes = std::vector<std::int64_t>;
  std::vector<std::pair<std::int64_t, std::int64_t>> nk;  // (n, k)
  Sizes rows, groups;
  if (gpu) {
    nk = quick ? decltype(nk){{1536, 2048}, {2048, 768}}
               : decltype(nk){{1536, 2048}, {2048, 1536}, {2048, 768}, {768, 2048}, {4096, 7168}, {7168, 2048}};
    rows = quick ? Sizes{16, 64, 256, 1024} : Sizes{16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
    groups = quick ? Sizes{8} : Sizes{4, 16};
  } else {
    nk = quick ? decltype(nk){{768, 2048}} : decltype(nk){{768, 2048}, {2048, 768}};
    rows = quick ? Sizes{16, 64, 256} : Sizes{16, 32, 64, 128, 256, 512, 1024};
    groups = {4};
  }
  // The step's weight gradients accumulate in fp32 under bf16 (measure.h's GemmShape).
  const DType wgrad_out = dtype == DType::bf16 ? DType::f32 : dtype;
  std::set<GroupedGemmShape> out;
  for (auto [n, k] : nk)
    for (std::int64_t r : rows)
      for (std::int64_t g : groups) {
        out.insert({g, r, n, k, false, dtype, dtype});
        out.insert({g, r, n, k, true, dtype, wgrad_out});
      }
  return out;
}

std::set<GemmShape> plain_gemms_of(const std::set<GroupedGemmShape>& grouped) {
  std::set<GemmShape> out;
  for (const GroupedGemmShape& g : grouped)
    if (!g.wgrad) out.insert({g.groups * g.rows, g.n, g.k, false, false, g.in, g.in});
  return out;
}

}  // namespace meshtrain::calibrate
