// FP8 linear GEMMs as exact emulation (precision fp8 on the cpu backend,
// engine/plan/fp8_recipe.h): Transformer Engine's recipes, DelayedScaling or
// Float8CurrentScaling, with Format.HYBRID. A linear layer's GEMMs take their
// operands rounded to FP8:
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
// row): the transformer layers' QKV, attention output, MLP up and down, MoE
// shared experts, and the routed experts' grouped up and down GEMMs.
// Replicated linears (a patch embedding, Swin's patch merging, a classifier
// head, a VQA projector), the vocabulary projection and attention itself
// stay in fp32. The routed experts have one scale per grouped tensor, where
// TE's GroupedLinear keeps one per expert: a rank casts its own experts'
// operands, and the amax reduction over the stage's tensor and replica
// groups (engine/step/fp8_training.h) covers every expert, so a grouped
// tensor takes the single-rank run's scale under expert parallelism too
// (tests/parallel/test_parallel_fp8.cc). The sim backend costs their casts,
// whose bytes are the same with one scale or one per expert.
//
// Current scaling (Fp8Recipe::current, TE's Float8CurrentScaling): a cast
// takes its scale from the tensor it casts. A pass over the tensor
// (Backend::amax, after TE's memset of the amax) measures its amax, an
// all-reduce (max) over the groups the tensor is split over makes it the
// whole tensor's, and the cast scales by current_scale of it: the
// single-rank run's scale, bit for bit, since max is exact in any order.
// TE reduces only where it casts before an FP8 gather (under sequence
// parallelism, a column-parallel input and a row-parallel output gradient,
// over tp); a weight shard, a column slice or a context rank's tokens keep
// their own amax there, which would make a parallel plan's values differ
// from the single rank's. So the emulation reduces over every group that
// splits the tensor, and a backend of shapes only (the sim) issues the
// reductions TE issues: the time a real run takes. No state crosses steps,
// so a checkpoint keeps none. A cast a real run kept (the backward's input
// and weight, a weight's later micro-batches) measures again only where
// values are held: the cpu emulation needs its values; on the sim it is
// nothing, as in a real run. TE's one-thread kernel that turns the amax into
// the scale is folded into the cast here (a kernel launch fewer per cast).
//
// Under full recomputation the recomputed forward quantizes its operands a
// second time: the same values with the step's fixed scales (or, current
// scaling, the same amax), so the same FP8 operands, and the step's amax is
// a maximum, which the repeat leaves alone.
//
// Under sequence parallelism the operands TE gathers over tp are gathered
// after their cast, as FP8 (Backend::all_gather_fp8, all_to_all_fp8 in the
// tp-comm-overlap ring): a column-parallel input, and a row-parallel output
// gradient cast on its shard (but in a layer with a bias, whose gradient
// reads the 16-bit rows: gathered, then cast). The cpu backend moves the
// 16-bit values, the same values; the sim times one byte an element.
//
// Each cast is one Backend::fp8_cast, which under delayed scaling also folds
// the operand's amax into a device tensor, read once a step (end of step,
// fold_fp8_amax). Its
// cost is what a Transformer Engine run pays (Fp8CastOp::copies): a forward
// input and an output gradient are cast with their transpose where they are
// made; a weight once a step, at its first micro-batch (TE keeps the cast
// over the step's micro-batches); the backward GEMMs' input and weight are
// the forward's casts, which a real run kept and the emulation casts again
// at no cost in time. On a backend that holds no values (the sim) a cast's
// output is its input, so memory is the bf16 run's plus what the memory
// model adds for FP8 (engine/plan/fp8_recipe.h). The cpu backend trains this way (exact emulation); the sim
// backend costs the casts (and times the GEMMs at FP8, use_fp8_gemms).
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

// is_fp8_linear (models/parameters.h) says which weights are such linears'.
// The linear's name ("layers.0.attn.qkv"; a routed experts' weight's own name) of such a weight.
std::string fp8_linear_name(const ParamInfo& p);

// Where a cast is made: as a real FP8 run makes it, or again where a real run
// reads the cast it kept (the backward's input and weight).
enum class Fp8Cast { made, kept };

// The groups among which a cast tensor is split into parts (current scaling
// reduces its amax over them): `over` all of them, `by_te` those over which
// Transformer Engine reduces it too.
struct Fp8Split {
  std::vector<const Group*> over;
  std::vector<const Group*> by_te;
};

// The scaling of the FP8 linears of one model chunk, and under delayed
// scaling their state (a pipeline stage owns its layers' state), on backend
// `b`.
class Fp8Scaling {
 public:
  // The linears of `params` (those is_fp8_linear selects), each with a fresh
  // history of `history` steps under delayed scaling.
  // `keep_weight_casts`: TE keeps a weight's cast over the step's micro-batches; false under ZeRO 3,
  // which gathers the weight again for each use, and each use casts it again (forward and backward).
  Fp8Scaling(Backend& b, std::span<const ParamInfo> params, Fp8Recipe recipe = Fp8Recipe::delayed,
             int history = kDefaultAmaxHistory, bool keep_weight_casts = true);

  Fp8Recipe recipe() const { return recipe_; }

  // `x` quantized with the scale of `linear`'s `which` tensor, as a new
  // tensor of x's shape. Delayed scaling: x's amax joins the step's. Current
  // scaling: the scale is x's own amax, reduced over split.over, the groups
  // among which x is one part of a tensor (collective over them).
  Tensor quantize(const std::string& linear, Fp8Operand which, const Tensor& x, Fp8Cast cast,
                  const Fp8Split& split = {});

  // Forgets the amax recorded so far (an evaluation's forward records none).
  void begin_step();
  // The step's amax of every tensor, linear by linear in name order, operand by operand, on the device.
  const Tensor& amax() const { return amax_; }
  // The same, read to the host.
  Result<std::vector<float>> step_amax() const;
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
    std::int64_t index = 0;               // its first tensor's place in amax_
    bool weight_cast = false;             // this step's weight cast is made (and kept)
  };
  Linear& find(const std::string& linear);
  const Linear& find(const std::string& linear) const;
  // Current scaling: x's amax, measured and reduced over split.over (the sim: over split.by_te).
  Tensor current_amax(const Tensor& x, const Fp8Split& split);
  Backend& b_;
  Fp8Recipe recipe_;
  bool keep_weight_casts_;
  std::map<std::string, Linear> linears_;
  Tensor amax_;  // (linears · kFp8Operands) f32; delayed scaling only
  int history_;
};

}  // namespace meshtrain
