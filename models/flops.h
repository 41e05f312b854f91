// Training FLOPs of one iteration, derived from the layer shapes of the
// parameter table (matrix multiplies only: 2 FLOPs per multiply-add; norms,
// activations and softmax are negligible and not counted, as in the
// literature). Attention counts the full s×s score matrix, as Megatron-LM's
// formula does, not the causal half.
#pragma once

#include <cstdint>

#include "models/model_spec.h"

namespace meshtrain {

enum class Recompute { none, selective, full };

struct ForwardFlops {
  double layers = 0;     // all transformer layers (GEMMs and attention)
  double attention = 0;  // of which the attention core (q·kᵀ and p·v)
  double head = 0;       // the output projection to the vocabulary
  double total() const { return layers + head; }
};
ForwardFlops forward_flops(const ModelSpec& m, std::int64_t batch, std::int64_t seq);

struct FlopCount {
  double model = 0;     // forward + backward = 3 × forward: what MFU counts
  double hardware = 0;  // model plus what recomputation runs again
  double per_token = 0; // model / (batch · seq)
};
// Full recomputation reruns every layer's forward (not the head); selective
// reruns the attention core only (Korthikanti et al. 2022).
FlopCount training_flops(const ModelSpec& m, std::int64_t batch, std::int64_t seq, Recompute r);

}  // namespace meshtrain
