// The analytic memory model: bytes per rank of parameters, gradients,
// optimizer state and activations for a model under a plan.
//
// Model states follow Rajbhandari et al. 2020 (ZeRO): with mixed precision a
// parameter costs 2 bytes, its gradient 2, and fp32 master weight, momentum
// and variance 12 (K = 12); in fp32 there is no master copy (4 + 4 + 8).
// Precision fp8 adds each FP8 linear's weight cast with its transpose (2
// bytes; none more with fp8_param_gather, whose FP8 weights replace the
// 16-bit ones) and keeps the saved inputs of linear layers' GEMMs at 1 byte
// (engine/plan/fp8_recipe.h).
// ZeRO stage 1 divides the optimizer state by dp, stage 2 the gradients too,
// stage 3 the parameters too, and stage 3 then holds one gathered layer being
// used and the next being prefetched (with the first one's full gradient).
//
// Offload (Plan::offload) moves the fp32 master weights and moments (K
// bytes; `params` also the parameter shards) to host memory, where the host
// also stages the gradients it updates from: 16 bytes per (sharded)
// parameter of host memory (master 4, m 4, v 4, gradient 4), whatever the
// precision (in fp32 the device keeps its working copy and the host its own
// master). Under `params` a gather first brings its unit's fp32 shard to the
// device; that buffer lives only while the gather is issued, never at the
// step's peak (measured: the cpu peak drops by exactly the offloaded bytes),
// so it is not counted.
//
// Activations follow Korthikanti et al. 2022 ("Reducing Activation
// Recomputation in Large Transformer Models", Sec. 4), written as the list of
// tensors a layer saves for backward, in units of s·b·h elements:
//   replicated over tp (split by sp):  the inputs and outputs of both norms: 4
//   split over tp:  q, k, v ((H + 2G)·D / h), attention output (1), the MLP's
//                   first output (ffn/h, twice for SwiGLU's gate|up) and the
//                   second's input (ffn/h)
//   dropout masks:  after attention and after the MLP (2, replicated) and on
//                   the attention probabilities (a·s/h, split)
//   materialised attention: softmax output and its dropout (2·a·s/h, split)
// With 2-byte values, 1-byte masks and h = ffn/4 that is the paper's
// s·b·h·(34 + 5·a·s/h) without parallelism and s·b·h·(10 + 24/t + 5·a·s/(h·t))
// with tensor parallelism. Full recomputation keeps only each layer's input.
// Selective recomputation drops the materialised attention terms. The
// recompute modules (Plan::recompute_modules) drop what they make again: an
// MoE layer's pre-MLP norm output (layernorm, 1 of the 4) and the routed
// experts' activation (moe_act); the backward's working set holds them again.
//
// Each block states what it saves (BlockDef::activation_bytes, models/block.h)
// under an ActivationLayout: the
// paper's (2-byte values, 1-byte masks, materialised attention) or
// meshtrain's own (values at the plan's precision, masks regenerated from the
// seed, flash-style attention that keeps only the per-row log-sum-exp, fp32
// row statistics of the norms, fp32 parameter gradients).
#pragma once

#include <cstdint>
#include <string>

#include "core/input_file.h"  // human_bytes, which memory reports print with
#include "engine/plan/plan.h"
#include "models/block.h"
#include "models/model_spec.h"

namespace meshtrain {

ActivationLayout korthikanti_layout();
// What meshtrain's layers save when run with plan `p`.
ActivationLayout meshtrain_layout(const Plan& p);

// What the blocks are asked about one micro-batch of plan `p`.
ActivationQuery activation_query(const ModelSpec& m, const Plan& p, const ActivationLayout& a);
// Bytes the model's first body block (a transformer layer: all of a
// decoder's are alike) saves for one micro-batch of plan `p`.
double layer_activation_bytes(const ModelSpec& m, const Plan& p, const ActivationLayout& a);
// Bytes the head saves for one micro-batch: for a decoder both norm tensors
// and this rank's logits shard (s·b·V/t).
double head_activation_bytes(const ModelSpec& m, const Plan& p, const ActivationLayout& a);

// Activation gradients that one layer's backward holds at once, at the peak
// of every step: they are transient (freed when the layer's backward returns)
// so Korthikanti et al. leave them out, but a measured peak includes them:
// dqkv ((H + 2G)·D/t), d attention output (H·D/t), the MLP's two input
// gradients (ffn/t, twice for SwiGLU's gate|up, and ffn/t), and seven of
// width h (the received output gradient, the two norms' input and output
// gradients, the residual sums), in units of s·b.
double layer_backward_working_bytes(const ModelSpec& m, const Plan& p, const ActivationLayout& a);

// Micro-batches (model chunks, for interleaving) whose activations a stage
// holds at its peak: GPipe m; 1F1B min(p − stage, m); interleaved the
// schedule builder's warm-up + 1, min((p − stage − 1)·2 + (v − 1)·p + 1, m·v)
// chunks (Megatron's), and m·v when m = p (all forwards first). Under EP
// all-to-all overlap each pair's forward trades layers with its backward and
// adds no whole micro-batch (peak_activation_bytes).
int inflight_microbatches(const Plan& p, int stage);
// The most activation bytes a pipeline stage holds at once under the plan's
// schedule, its chunk c keeping chunk_bytes[c] from a micro-batch's forward to
// its backward (chunks of a flexible layout differ). Under a zero-bubble
// schedule deferred_bytes[c] (empty: none) stay from B to the W pass
// (BlockDef::deferred_weight_bytes). Under EP all-to-all overlap a pair's
// forward and backward trade layers as they run side by side, forward layer
// k beside backward layer L-1-k: chunk_layers[c] lists chunk c's layers'
// bytes in forward order (empty: a pair holds both chunks whole).
double peak_activation_bytes(const Plan& p, int stage, const std::vector<double>& chunk_bytes,
                             const std::vector<double>& deferred_bytes = {},
                             const std::vector<std::vector<double>>& chunk_layers = {});

struct MemoryBreakdown {
  std::int64_t parameter_count = 0;  // parameters on this rank (tp/pp/ep shard)
  std::int64_t expert_parameter_count = 0;  // of which routed experts' (replicated over the expert-data group)
  double parameters = 0;             // bytes
  double gradients = 0;
  double optimizer = 0;
  // ZeRO-3: two gathered layers (the one in use and the prefetched next) and
  // the full gradient of the one backward works on, sized by the largest
  // transformer layer (the embedding and head units are assumed no larger).
  // A chunk of one layer holds one gathered layer: a pass does not prefetch
  // into the next chunk's (the engine does not know which pass comes next).
  double zero3_working = 0;
  // ZeRO-2 and 3 keep no whole gradient buffer: a layer's gradient is whole
  // while backward works on it (stage 2; stage 3 counts it in zero3_working),
  // and the tied embedding's stays whole from the head's backward until the
  // end of the iteration on the stages that hold it (it is summed over both
  // pipeline ends, or with pp 1 over the head's and the embedding's uses,
  // before it is reduce-scattered).
  double gradient_working = 0;
  // ZeRO 1 keeps the full gradient buffer (micro-batches accumulate into it)
  // plus the reduce-scatter's output, the rank's reduced 1/dp shard: the
  // backend's collectives do not work in place. (Stage 2's `gradients` is
  // that shard already.)
  double gradient_shard = 0;
  double activations = 0;
  // layer_backward_working_bytes; on the last stage the larger of that and the
  // head's saved tensors plus its logits' gradient (one micro-batch's head is
  // in here, not in `activations`: its backward frees it before the layers').
  double backward_working = 0;
  int inflight = 0;  // micro-batches (or chunks) of activations held
  // Offload: device bytes the plan moves to host memory (already left out of
  // the fields above), and the host memory it uses.
  double offloaded = 0;
  double host = 0;
  // Device bytes (the host's are `host`).
  double total() const {
    return parameters + gradients + optimizer + zero3_working + gradient_working + gradient_shard + activations +
           backward_working;
  }
  // Adds what a rank also holds of another part of the model (a segment of a
  // plan made of segments): every byte and parameter adds; the micro-batches
  // in flight are the larger count.
  MemoryBreakdown& operator+=(const MemoryBreakdown& o);
};

// The rank at pipeline stage `stage`: its parameters and its layers per chunk
// follow the plan's stage split (first/last stage layer counts, StageSplit).
MemoryBreakdown memory_per_rank(const ModelSpec& m, const Plan& p, int stage, const ActivationLayout& a);

}  // namespace meshtrain
