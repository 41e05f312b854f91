// Exact emulation of FP8 rounding and per-tensor delayed scaling, as FP8
// training runs its GEMM operands (engine/plan/fp8_recipe.h): a value is scaled,
// rounded to the nearest FP8 number (ties to even, saturating at the format's
// largest finite value, as CUDA's __nv_cvt_float_to_fp8 with __NV_SATFINITE
// and Transformer Engine's casts do) and multiplied back by the inverse scale.
//
// Formats (OCP 8-bit floating point specification, Micikevicius et al. 2022):
//   E4M3: 4 exponent bits (bias 7), 3 mantissa bits, largest 448 = 1.75·2^8,
//         no infinities, S.1111.111 is NaN; smallest subnormal 2^-9.
//   E5M2: 5 exponent bits (bias 15), 2 mantissa bits, largest 57344 =
//         1.75·2^15, IEEE-like infinities and NaNs; smallest subnormal 2^-16.
// Transformer Engine's recipe uses E4M3 for forward tensors and E5M2 for
// gradients (Format.HYBRID).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace meshtrain {

enum class Fp8Format { e4m3, e5m2 };

// Transformer Engine's default amax history (recipe.DelayedScaling,
// amax_history_len = 1024 since TE 1.0) and margin (0).
inline constexpr int kDefaultAmaxHistory = 1024;

// The largest finite value: 448 (E4M3) or 57344 (E5M2).
float fp8_max(Fp8Format f);

// `x` rounded to the nearest value of `f`, ties to even; beyond the largest
// finite value (infinities included) it saturates to ±fp8_max; NaN stays NaN.
float round_to_fp8(float x, Fp8Format f);
// The 8-bit encoding of round_to_fp8(x, f) (NaN: 0x7F, the sign of x kept).
std::uint8_t fp8_bits(float x, Fp8Format f);
// The value an encoding stands for (NaN and, for E5M2, infinities included).
float fp8_value(std::uint8_t bits, Fp8Format f);

// Largest |x| over `xs` (0 when empty; NaN when any is NaN, so that a step's
// bad values cannot hide in the scale).
float amax(std::span<const float> xs);

// Per-tensor current scaling (Transformer Engine's recipe.Float8CurrentScaling,
// Megatron's --fp8-recipe tensorwise): a tensor's scale comes from its own
// amax, measured by a pass over it just before the cast, as TE's
// compute_scale_from_amax (transformer_engine/common/recipe/
// recipe_common.cuh) makes it: fp8_max / amax; 1 when the amax is 0, not
// finite or gives a NaN; the largest float when the quotient overflows.
float current_scale(float amax, Fp8Format f);

// How a run's FP8 tensors get their scales: from the last steps' amax
// (DelayedScaling below) or from their own (current_scale).
enum class Fp8Recipe { delayed, current };

// One tensor's quantization as an FP8 GEMM sees it: each x becomes
// round_to_fp8(x·scale)·(1/scale), all in fp32.
void fp8_quantize(std::span<const float> xs, float scale, Fp8Format f, std::span<float> out);

// Per-tensor delayed scaling (Transformer Engine's recipe.DelayedScaling,
// amax_compute_algo "max"): a step multiplies by a scale known before its
// GEMM runs, fp8_max / 2^margin / max(amax over the last `history` steps);
// each step then records its own amax. Until a step has recorded a finite,
// non-zero amax the scale stays at its previous value (1 at first), as TE
// keeps it.
class DelayedScaling {
 public:
  // history >= 1 steps, margin >= 0 (powers of two of headroom).
  static Result<DelayedScaling> make(Fp8Format format, int history, int margin = 0);

  float scale() const { return scale_; }
  int history_length() const { return static_cast<int>(history_.size()); }
  // After a step: its tensor's amax joins the history (the oldest leaves) and the scale follows.
  void record(float step_amax);

  // The state as a checkpoint keeps it: [scale, amax history oldest first].
  std::vector<float> state() const;
  // Restores what state() returned; an Error names a wrong size or a value
  // that no history could hold (negative, not finite, a scale <= 0).
  Status restore(std::span<const float> state);

 private:
  DelayedScaling(Fp8Format format, int history, int margin);
  Fp8Format format_;
  int margin_;
  std::vector<float> history_;  // a ring of the last steps' amax, 0 where none yet
  std::size_t next_ = 0;
  float scale_ = 1;
};

}  // namespace meshtrain
