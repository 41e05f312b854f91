// Fuzz target: the safetensors reader (engine/export/safetensors.h) and, for
// a file it accepts, the Hugging Face mapping onto a micro GPT-2 (the model of
// the corpus's valid seed, corpus/safetensors/micro-gpt2.safetensors), as
// `train --init-from` reads them.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/export/hf_export.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace meshtrain;
  static const ModelSpec micro = [] {
    ModelSpec m = *model_preset("tiny");
    m.name = "micro-gpt2";
    m.layers = 1, m.hidden = 4, m.heads = m.kv_heads = 1, m.ffn = 16, m.seq_len = 4;
    return m;
  }();
  auto file = decode_safetensors(meshtrain::fuzz::fuzz_text(data, size), "fuzz.safetensors");
  if (!file.ok()) return 0;
  for (const SafeTensor& t : file->tensors) (void)to_float32(t);
  (void)from_hf_tensors(micro, *file, "fuzz.safetensors");
  return 0;
}
