// The grouped GEMMs `meshtrain calibrate` measures (simulator/calibration.h,
// "grouped_gemm"): MoE experts over their tokens, at the shapes of
// fine-grained experts, over a log-spaced range of rows (tokens) per expert.
#pragma once

#include <set>

#include "engine/calibrate/measure.h"

namespace meshtrain::calibrate {

// Forward and wgrad shapes, activations at `dtype` (weight gradients fp32
// under bf16, as the step accumulates them). On a GPU (n, k) cover the
// experts of qwen3-30b-a3b (hidden 2048, expert ffn 768: SwiGLU up n = 1536,
// down k = 768, and their input gradients with n and k swapped) and of
// DeepSeek-V3 (hidden 7168, expert ffn 2048), at 16..4096 rows per expert and
// 4 and 16 experts; the cpu backend, orders of magnitude slower, measures
// the qwen3 shapes at 4 experts up to 1024 rows, so that a calibration stays
// minutes long.
// `quick` keeps a few rows and one shape (seconds on the cpu backend).
std::set<GroupedGemmShape> grouped_gemm_grid(bool quick, bool gpu, DType dtype);

// For each forward grouped shape, the plain GEMM of its total rows
// (groups·rows, n, k): the large-GEMM efficiency the grouped kernel is
// compared with, and the shape the tile model costs it as.
std::set<GemmShape> plain_gemms_of(const std::set<GroupedGemmShape>& grouped);

}  // namespace meshtrain::calibrate
