// export_logits CHECKPOINT_DIR TOKENS_FILE LOGITS_FILE: meshtrain's logits for
// one sequence, for tests/export/hf_reference.py to compare with a PyTorch
// model built from the export. TOKENS_FILE holds T + 1 whitespace-separated
// ids: the first T are the input, the last T the targets. Writes the (T, V)
// logits as raw little-endian float32 and prints "loss L", the mean cross
// entropy the model's own head computes for those targets.
//
// The body runs as a chunk without the head (embedding and layers, the cpu
// backend's kernels); the final norm and the projection onto the vocabulary
// then run as the head does, with the backend's norm and GEMM.
#include <cstdio>
#include <fstream>
#include <iterator>

#include "backends/cpu/cpu_backend.h"
#include "core/input_file.h"
#include "engine/export/hf_export.h"
#include "models/model_chunk.h"

using namespace meshtrain;

namespace {

Tensor upload(Backend& b, const std::vector<float>& v) {
  Tensor t = b.empty(Shape{static_cast<std::int64_t>(v.size())});
  b.write(t, v);
  return t;
}

void load(Backend& b, ModelChunk& chunk, const ParamMap& params) {
  for (const ParamSlot& slot : chunk.parameters().slots()) {
    Tensor value = slot.value;
    b.write(value, params.at(slot.info.name));
  }
}

MicroBatch micro_batch(Backend& b, const std::vector<std::int32_t>& tokens) {
  const int T = static_cast<int>(tokens.size()) - 1;
  MicroBatch mb;
  mb.batch = 1;
  mb.seq = T;
  mb.ids = b.empty(Shape{T}, DType::i32);
  mb.targets = b.empty(Shape{T}, DType::i32);
  b.write(mb.ids, std::span<const std::int32_t>(tokens.data(), static_cast<std::size_t>(T)));
  b.write(mb.targets, std::span<const std::int32_t>(tokens.data() + 1, static_cast<std::size_t>(T)));
  return mb;
}

// norm(x) · Wᵀ over the vocabulary, as LmHead computes it.
Result<std::vector<float>> head_logits(Backend& b, const ModelSpec& m, const ParamMap& p, const Tensor& x) {
  const std::int64_t N = x.shape()[0], C = m.hidden, V = m.vocab;
  Tensor nf = b.empty(Shape{N, C}), mean = b.empty(Shape{N}), rstd = b.empty(Shape{N});
  const Tensor w = upload(b, p.at("final_norm.weight"));
  if (m.norm == NormKind::layernorm)
    b.layernorm_forward(x, w, upload(b, p.at("final_norm.bias")), nf, mean, rstd, m.norm_eps);
  else
    b.rmsnorm_forward(x, w, nf, rstd, m.norm_eps);
  Tensor logits = b.empty(Shape{N, V});
  GemmOp op;
  op.trans_b = m.tied_embeddings;  // the embedding is (V, C), an untied head (C, V)
  const Tensor head = upload(b, p.at(m.tied_embeddings ? "embed.tokens" : "head"))
                          .view(m.tied_embeddings ? Shape{V, C} : Shape{C, V});
  b.gemm(nf, head, logits, op);
  std::vector<float> host(static_cast<std::size_t>(N * V));
  MT_TRY(b.read(logits, host));
  return host;
}

Status run(const std::string& dir, const std::string& tokens_file, const std::string& out) {
  MT_ASSIGN(const CheckpointParams c, load_checkpoint_params(dir));
  const ModelSpec& m = c.model;
  std::ifstream in(tokens_file);
  const std::vector<std::int32_t> tokens{std::istream_iterator<std::int32_t>(in),
                                         std::istream_iterator<std::int32_t>()};
  if (tokens.size() < 2 || tokens.size() > static_cast<std::size_t>(m.seq_len) + 1)
    return make_error("'{}' holds {} tokens; give 2 to seq_len + 1 = {}", tokens_file, tokens.size(), m.seq_len + 1);
  CpuBackend b;
  const TensorParallel tp{Group{0, {0}}, 0, 1};
  const MicroBatch mb = micro_batch(b, tokens);
  ModelChunk body(b, m, ChunkLayers{0, m.layers, true, false}, tp, ChunkOptions{});
  load(b, body, c.params);
  SavedActivations saved;
  const Tensor hidden = body.forward(mb, Tensor(), saved);
  MT_ASSIGN(const std::vector<float> logits, head_logits(b, m, c.params, hidden));
  ModelChunk whole(b, m, ChunkLayers{0, m.layers, true, true}, tp, ChunkOptions{});
  load(b, whole, c.params);
  SavedActivations saved_whole;
  float loss_sum = 0;
  MT_TRY(b.read(whole.forward(mb, Tensor(), saved_whole), std::span<float>(&loss_sum, 1)));
  const std::string bytes(reinterpret_cast<const char*>(logits.data()), logits.size() * sizeof(float));
  MT_TRY(write_output_file(out, bytes, "logits file"));
  std::printf("loss %.9g\n", static_cast<double>(loss_sum) / static_cast<double>(mb.seq));
  return ok_status();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: export_logits CHECKPOINT_DIR TOKENS_FILE LOGITS_FILE\n");
    return 2;
  }
  const Status s = run(argv[1], argv[2], argv[3]);
  if (!s.ok()) {
    std::fprintf(stderr, "export_logits: error: %s\n", s.error().message().c_str());
    return 1;
  }
  return 0;
}
