// A whole image model (ViT, Swin, VQA) as one chunk on the cpu backend with a
// random micro-batch, and its gradient check: what the vision and the VQA
// model tests share.
#pragma once

#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "models/model_chunk.h"
#include "tests/models/directional_derivatives.h"

namespace meshtrain::testing {

struct ImageModelFixture {
  CpuBackend b;
  ModelSpec m;
  ModelChunk chunk;
  MicroBatch mb;
  // `batch` samples of normal pixels (and, VQA, a question of random ids)
  // with random targets: classes, or answer words.
  ImageModelFixture(const ModelSpec& spec, std::uint64_t seed, int batch, ChunkOptions options = {})
      : m(spec), chunk(b, m, ChunkLayers{0, spec.layers, true, true}, TensorParallel{Group{0, {0}}, 0, 1}, options) {
    chunk.parameters().initialize(seed);
    std::mt19937 rng(static_cast<std::uint32_t>(seed));
    std::normal_distribution<float> pixel;
    const unsigned targets = static_cast<unsigned>(m.vqa() ? m.vocab : m.classes);
    std::vector<float> pixels(static_cast<std::size_t>(batch) * m.image_size * m.image_size * m.channels);
    for (auto& v : pixels) v = pixel(rng);
    mb.pixels = b.empty(Shape{batch, m.image_size, m.image_size, m.channels});
    b.write(mb.pixels, pixels);
    if (m.vqa()) {
      std::vector<std::int32_t> ids(static_cast<std::size_t>(batch) * m.question_len);
      for (auto& v : ids) v = static_cast<std::int32_t>(rng() % targets);
      mb.ids = b.empty(Shape{static_cast<std::int64_t>(ids.size())}, DType::i32);
      b.write(mb.ids, ids);
    }
    std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
    for (auto& v : labels) v = static_cast<std::int32_t>(rng() % targets);
    mb.targets = b.empty(Shape{batch}, DType::i32);
    b.write(mb.targets, labels);
    mb.batch = batch;
    mb.seq = m.seq_len;
  }
  double loss() { return chunk_loss(b, chunk, mb, mb.batch); }
  std::vector<float> gradient() { return chunk_gradient(b, chunk, mb, mb.batch); }
};

inline void check_image_model_gradient(const ModelSpec& spec, std::uint64_t seed, int batch) {
  INFO("model " << spec.name << ", seed " << seed);
  ImageModelFixture f(spec, seed, batch);
  {
    // Weights at the initial std of 0.02 leave attention almost uniform, and
    // the relative position tables' (and a VQA encoder's) gradients near what
    // fp32 losses resolve: larger weights make every tensor's gradient measurable.
    std::vector<float> v(static_cast<std::size_t>(f.chunk.parameters().numel()));
    REQUIRE(f.b.read(f.chunk.parameters().values(), v).ok());
    for (float& x : v) x *= 4.f;
    f.b.write(f.chunk.parameters().values(), v);
  }
  check_directional_derivatives(f.b, f.chunk.parameters(), f.gradient(), [&] { return f.loss(); },
                                DirectionalCheck{2e-3, true, false});
}

}  // namespace meshtrain::testing
