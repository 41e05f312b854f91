// FP8 training as a plan's precision (Precision::fp8): Transformer Engine's
// recipe, which the simulator costs and the memory model counts.
//
// The recipe (NVIDIA Transformer Engine, "Using FP8 with Transformer Engine",
// https://docs.nvidia.com/deeplearning/transformer-engine/user-guide/examples/fp8_primer.html,
// recipe.DelayedScaling with Format.HYBRID; Micikevicius et al. 2022, "FP8
// Formats for Deep Learning"):
//   - the GEMMs of linear layers take FP8 operands: activations and weights
//     as E4M3 in forward, gradients as E5M2 in backward, accumulating in
//     higher precision and writing bf16;
//   - each tensor has one scale, fp8_max / amax, where amax is the largest
//     of the last steps' amax history (delayed scaling: the scale a step
//     uses is known before its GEMM runs), or, with Plan::fp8_recipe
//     current (recipe.Float8CurrentScaling), the tensor's own amax,
//     measured by a pass over it just before its cast;
//   - everything else (attention, norms, activations, the output layer) stays
//     bf16, parameters are bf16 with an FP8 copy of each FP8 linear's weight
//     for the GEMMs (the cast and its transpose, made at a step's first
//     micro-batch and kept over the others: TE's weight workspace; under
//     ZeRO 3, which gathers a layer for each use, made at each use and held
//     with the gathered layer), master weights and Adam state fp32;
//   - with Plan::fp8_param_gather (Megatron-Core's --fp8-param-gather) that
//     FP8 copy is the parameter: no bf16 copy of the FP8 linears' weights,
//     the optimizer casting each rank's master shard to FP8 and the
//     distributed optimizer all-gathering the FP8 bytes (GradientBuckets::
//     gather); ZeRO 3's shards of them are FP8 values, a byte each. The weight's cast at a step's first micro-batch is still
//     costed as a cast of the bf16 weight with its transpose, where TE makes
//     only the transpose of the gathered FP8 data (a byte an element read
//     instead of two), the master shard's cast is costed as the bf16
//     refresh it replaces, and current scaling's all-reduce of those casts'
//     amax over the data-parallel group (one small all-reduce a step) is
//     left out;
//   - a linear layer saves for backward the FP8 cast of its input (1 byte).
// meshtrain simulates this precision, and the cpu backend trains in it as
// exact emulation (engine/step/fp8_training.h; fp32 in place of bf16 there).
#pragma once

#include "core/status.h"
#include "engine/plan/plan.h"
#include "models/model_spec.h"
#include "simulator/cluster_spec.h"

namespace meshtrain {

// Bytes per FP8 linear's weight element of its FP8 copy: the cast and its
// transpose (Hopper's FP8 GEMMs read a weight in both layouts; TE's
// Float8Tensor keeps both while gradients are taken).
inline constexpr double kFp8WeightBytes = 2;
// Bytes per element of a saved linear-layer input (its FP8 cast).
inline constexpr int kFp8SavedGemmInputBytes = 1;

// An Error naming the device and the fix when `d` has no FP8 tensor cores.
Status check_fp8_device(const sim::DeviceSpec& d);

// Bytes rank `rank` holds under `p` more than under the same plan with its
// fp8 segments (a uniform plan is one) in bf16, summed over the segments it
// is in: their FP8 weight copies (none under fp8_param_gather, whose FP8
// parameters take the 16-bit weights' bytes) less the saved GEMM inputs kept at 1 byte
// instead of 2 (negative when activations dominate). The sim backend
// allocates the bf16 run's tensors (an FP8 cast there is costed, not held:
// models/fp8_linear.h); a simulated fp8 peak adds this.
double fp8_extra_bytes(const ModelSpec& m, const Plan& p, int rank);

}  // namespace meshtrain
