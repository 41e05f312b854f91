// FP8 linear GEMMs as exact emulation (precision fp8 on the cpu backend,
// engine/plan/fp8_recipe.h): Transformer Engine's recipe, DelayedScaling with
// Format.HYBRID. A linear layer's GEMMs take their operands rounded to FP8:
// forward the input activation and the weight as E4M3, backward the output
// gradient as E5M2, each tensor with its own per-tensor scale. Quantizing is
// core/fp8's fp8_quantize: scale, round to the FP8 grid (ties to even,
// saturating), unscale, all in fp32; the GEMM that follows is the backend's
// fp32 one, so its result is exactly the fp32 GEMM of the FP8 operands. The
// input gradient is dy_q · W_qᵀ and the weight gradient x_qᵀ · dy_q, as TE's
// dgrad and wgrad read the FP8 casts; the bias and its gradient stay fp32.
//
// Delayed scaling: a step quantizes with scales known before it starts
// (fp8_max / max of the last kDefaultAmaxHistory steps' amax; 1 before any,
// as TE's init_fp8_meta_tensors sets them, transformer_engine/pytorch/module/
// base.py) and records each tensor's amax over the step's micro-batches. The
// engine reduces those amax over every rank that holds part of a tensor and
// folds them into the histories at the end of the step (end_step), so a
// tensor sharded over ranks uses the single-rank run's scale, bit for bit.
//
// Which linears: the tensor-parallel ones (column and row; TpSplit column or
// row, not experts): the transformer layers' QKV, attention output, MLP up
// and down, and MoE shared experts. Replicated linears (a patch embedding,
// Swin's patch merging, a classifier head, a VQA projector), the vocabulary
// projection, attention itself and routed experts stay in fp32.
//
// Under full recomputation the recomputed forward quantizes its operands a
// second time: the same values with the step's fixed scales, so the same FP8
// operands, and the step's amax is a maximum, which the repeat leaves alone.
// Only the cost doubles (one more host round trip per operand).
//
// The emulation reads each operand to the host and writes its FP8 values
// back (Backend::read/write): exact and backend-neutral, but a device round
// trip per operand, which is why only the cpu backend trains this way.
#pragma once

#include <map>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "core/fp8.h"
#include "models/parameters.h"

namespace meshtrain {

// The three FP8 tensors of one linear layer.
enum class Fp8Operand { input = 0, weight = 1, grad = 2 };
inline constexpr int kFp8Operands = 3;

// Whether `p` is the weight of a linear layer whose GEMMs run in FP8.
bool is_fp8_linear(const ParamInfo& p);
// The linear's name ("layers.0.attn.qkv") of such a weight.
std::string fp8_linear_name(const ParamInfo& p);

// The delayed-scaling state of the FP8 linears of one model chunk (a
// pipeline stage owns its layers' state).
class Fp8Scaling {
 public:
  // The linears of `params` (those is_fp8_linear selects), each with a fresh
  // history of `history` steps.
  Fp8Scaling(std::span<const ParamInfo> params, int history = kDefaultAmaxHistory);

  // `x` quantized with the scale of `linear`'s `which` tensor, as a new
  // tensor of x's shape; x's amax joins the step's.
  Tensor quantize(Backend& b, const std::string& linear, Fp8Operand which, const Tensor& x);

  // Forgets the amax recorded so far (an evaluation's forward records none).
  void begin_step();
  // This step's amax of every tensor, linear by linear in name order, operand by operand.
  std::vector<float> step_amax() const;
  // Folds `amax` (step_amax's layout, reduced over the ranks) into the histories.
  Status end_step(std::span<const float> amax);

  // The scale `which` of `linear` uses in the current step.
  float scale(const std::string& linear, Fp8Operand which) const;
  // The linears' names, in name order.
  std::vector<std::string> linears() const;
  // One linear's state, [scale, history oldest first] per operand, as a checkpoint keeps it.
  std::vector<float> state(const std::string& linear) const;
  Status restore(const std::string& linear, std::span<const float> state);
  // The size of state() of every linear.
  std::size_t state_size() const;

 private:
  struct Linear {
    std::vector<DelayedScaling> scaling;  // by Fp8Operand
    float amax[kFp8Operands] = {0, 0, 0};
  };
  Linear& find(const std::string& linear);
  const Linear& find(const std::string& linear) const;
  std::map<std::string, Linear> linears_;
  int history_;
};

}  // namespace meshtrain
