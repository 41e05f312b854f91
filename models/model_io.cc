#include "models/model_io.h"

#include <fmt/format.h>

namespace meshtrain {

ModelIo model_io(const ModelSpec& m, std::int64_t seq) {
  ModelIo io;
  io.routes_to_experts = m.moe();
  switch (m.family) {
    case ModelFamily::decoder:
      io.ids_per_sample = seq;
      io.tokens_per_sample = seq;
      io.targets_per_sample = seq;
      io.target_range = m.vocab;
      io.targets_are_ids = true;
      io.layers_alike = true;
      for (int l = 1; l < m.layers; ++l) io.layers_alike = io.layers_alike && m.moe_layer(l) == m.moe_layer(0);
      return io;
    case ModelFamily::vit:
    case ModelFamily::swin:
      io.image_side = m.image_size, io.channels = m.channels;
      io.tokens_per_sample = m.seq_len, io.tokens_fixed_by_model = true;
      io.targets_per_sample = 1, io.target_range = m.classes;
      io.reports_accuracy = true;
      return io;
    case ModelFamily::vqa:
      // An image and a question in, one answer word out.
      io.image_side = m.image_size, io.channels = m.channels;
      io.ids_per_sample = m.question_len;
      io.tokens_per_sample = m.seq_len, io.tokens_fixed_by_model = true;
      io.targets_per_sample = 1, io.target_range = m.vocab;
      io.reports_accuracy = true;
      return io;
  }
  return io;
}

std::string ModelIo::describe() const {
  const std::string image = fmt::format("{}×{}×{} images", image_side, image_side, channels);
  if (image_side == 0) return "token ids";
  if (ids_per_sample == 0) return image;
  return fmt::format("{} and {}-token questions", image, ids_per_sample);
}

}  // namespace meshtrain
