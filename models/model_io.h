// What a model reads per sample and what its loss is over, as data: the
// engine stages inputs, checks batches, counts tokens and reports metrics
// from this description and never asks which kind of model it runs
// (a decoder, a ViT or Swin classifier, a VQA model). A new model kind says
// here what it takes; the engine needs no new branch.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "models/model_spec.h"

namespace meshtrain {

struct ModelIo {
  // Token ids a sample carries (a sequence, or a question; 0: none).
  std::int64_t ids_per_sample = 0;
  // An image per sample, image_side² pixels of `channels` values (0: none).
  int image_side = 0, channels = 0;
  // Positions the blocks see per sample: the run's sequence length, or what
  // the model's images (and question) make of it, whatever the run asks.
  std::int64_t tokens_per_sample = 0;
  bool tokens_fixed_by_model = false;  // true: the run's seq_len does not apply
  // Loss terms per sample (next-token prediction: one per position; a
  // classifier or an answer word: one) and the range of a target id.
  std::int64_t targets_per_sample = 0;
  int target_range = 0;
  // Targets are the sample's own ids (next-token prediction over the stream).
  bool targets_are_ids = false;
  // Each sample's loss is one classification, so top-1 accuracy is a figure worth reporting.
  bool reports_accuracy = false;
  // Blocks route tokens to experts: a step has routing statistics and
  // expert-parallel groups, and expert gradients are counted apart in the norm.
  bool routes_to_experts = false;
  // Tokens a sample contributes to a step's throughput (its loss terms).
  std::int64_t throughput_tokens() const { return targets_per_sample; }
  std::int64_t pixels_per_sample() const { return std::int64_t{image_side} * image_side * channels; }
  // "token ids", "28×28×1 images", "28×28×1 images and 8-token questions": for messages.
  std::string describe() const;
  // A body whose layers are all alike (the same blocks, dense or all routed
  // to experts), so the planner may cost one layer and multiply.
  bool layers_alike = false;
  // What one sample of throughput counts: "token" or "image".
  std::string_view unit() const { return image_side > 0 ? "image" : "token"; }
  // "vision model" (it reads images) or "language model": for messages.
  std::string_view noun() const { return image_side > 0 ? "vision model" : "language model"; }
};

// Model `m`'s inputs and loss at sequence length `seq` (ignored where the
// model fixes its own tokens).
ModelIo model_io(const ModelSpec& m, std::int64_t seq);
// The same at the model's own sequence length (the kind-level facts:
// unit, routing, what it reads).
inline ModelIo model_io(const ModelSpec& m) { return model_io(m, m.seq_len); }

}  // namespace meshtrain
