// models/model_io.h: what each model kind reads and what its loss is over,
// derived here from the model's own fields, so the engine can stage data
// from the description alone.
#include <catch2/catch.hpp>

#include "models/model_io.h"
#include "models/model_spec.h"

using namespace meshtrain;

TEST_CASE("a decoder reads its sequence's ids and predicts every position") {
  const ModelSpec m = *model_preset("gpt2-124m");
  const ModelIo io = model_io(m, 512);
  CHECK(io.ids_per_sample == 512);
  CHECK(io.tokens_per_sample == 512);
  CHECK_FALSE(io.tokens_fixed_by_model);
  CHECK(io.targets_per_sample == 512);
  CHECK(io.targets_are_ids);
  CHECK(io.target_range == m.vocab);
  CHECK(io.pixels_per_sample() == 0);
  CHECK_FALSE(io.reports_accuracy);
  CHECK_FALSE(io.routes_to_experts);
  CHECK(io.layers_alike);
  CHECK(io.unit() == "token");
  CHECK(io.describe() == "token ids");
}

TEST_CASE("a classifier reads one image, makes its own tokens and ends in one label") {
  const ModelSpec m = *model_preset("vit-tiny");
  const ModelIo io = model_io(m, 4096);  // the run's sequence length does not apply
  CHECK(io.ids_per_sample == 0);
  CHECK(io.pixels_per_sample() == std::int64_t{m.image_size} * m.image_size * m.channels);
  CHECK(io.tokens_fixed_by_model);
  CHECK(io.tokens_per_sample == m.seq_len);
  CHECK(io.targets_per_sample == 1);
  CHECK(io.target_range == m.classes);
  CHECK(io.reports_accuracy);
  CHECK_FALSE(io.layers_alike);
  CHECK(io.unit() == "image");
  CHECK(io.noun() == "vision model");
}

TEST_CASE("a VQA model reads an image and a question and answers one word") {
  for (const std::string& name : model_preset_names()) {
    const ModelSpec m = *model_preset(name);
    if (m.family != ModelFamily::vqa) continue;
    INFO(name);
    const ModelIo io = model_io(m, 0);
    CHECK(io.ids_per_sample == m.question_len);
    CHECK(io.pixels_per_sample() == std::int64_t{m.image_size} * m.image_size * m.channels);
    CHECK(io.targets_per_sample == 1);
    CHECK(io.target_range == m.vocab);
    CHECK_FALSE(io.targets_are_ids);
  }
}

TEST_CASE("a mixture-of-experts decoder routes, and its layers are alike only if all route") {
  ModelSpec m = *model_preset("gpt2-124m");
  m.experts = 8, m.top_k = 2;
  CHECK(model_io(m, 128).routes_to_experts);
  CHECK(model_io(m, 128).layers_alike);
  m.moe_every = 2;  // every other layer dense
  CHECK_FALSE(model_io(m, 128).layers_alike);
}
