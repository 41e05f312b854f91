// Training FLOPs of one iteration, the sum of the model's blocks' own counts
// (models/block.h), derived from their shapes (matrix multiplies only: 2 FLOPs
// per multiply-add; norms, activations and softmax are negligible and not
// counted, as in the literature). Attention counts the full score matrix
// (s×s, or a window's), as Megatron-LM's formula does, not the causal half.
#pragma once

#include <cstdint>

#include "models/model_spec.h"

namespace meshtrain {

enum class Recompute { none, selective, full };

// Modules recomputed in backward beyond `recompute` (Megatron-Core's
// --recompute-modules; engine/plan/plan.h): their outputs are freed after
// forward and made again, from tensors the layer keeps anyway, just before
// the backward that reads them.
struct RecomputeModules {
  // An MoE layer's pre-MLP norm, whose output the router, the dispatch and
  // the shared experts read: the norms Megatron-Core with Transformer Engine
  // keeps as modules of their own (TE fuses the others into the linear
  // layers that read them: LayerNormLinear, LayerNormMLP).
  bool layernorm = false;
  // The routed experts' activation, the input of their down GEMM, from
  // their up GEMM's output.
  bool moe_act = false;
  bool any() const { return layernorm || moe_act; }
  bool operator==(const RecomputeModules&) const = default;
};

struct ForwardFlops {
  double embedding = 0;  // a patch embedding's projection (a token lookup costs none)
  double layers = 0;     // all body blocks (transformer layers' GEMMs and attention, patch mergings)
  double attention = 0;  // of which the attention core (q·kᵀ and p·v)
  double head = 0;       // the output projection to the vocabulary or the classes
  double total() const { return embedding + layers + head; }
  ForwardFlops& operator+=(const ForwardFlops& o) {
    embedding += o.embedding, layers += o.layers, attention += o.attention, head += o.head;
    return *this;
  }
};
// `batch` samples (sequences of `seq` tokens, or images, whose tokens the model fixes).
ForwardFlops forward_flops(const ModelSpec& m, std::int64_t batch, std::int64_t seq);

struct FlopCount {
  double model = 0;     // forward + backward = 3 × forward: what MFU counts
  double hardware = 0;  // model plus what recomputation runs again
  double per_token = 0; // model / (batch · seq): per token, or per image for vision models
};
// Full recomputation reruns every layer's forward (not the head); selective
// reruns the attention core only (Korthikanti et al. 2022).
FlopCount training_flops(const ModelSpec& m, std::int64_t batch, std::int64_t seq, Recompute r);

}  // namespace meshtrain
