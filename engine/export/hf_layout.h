// Hugging Face names and layouts of meshtrain's decoder parameters, for
// GPT-2 (GPT2LMHeadModel), Llama (LlamaForCausalLM) and Mixtral
// (MixtralForCausalLM: Llama's layers with a block of SwiGLU experts), and
// their config.json.
//
// meshtrain keeps linear weights (in, out) and fuses some of them; Hugging
// Face keeps nn.Linear weights (out, in) and GPT-2's Conv1D weights (in, out):
//
//   meshtrain                 GPT-2 (transformer.)       Llama (model.)
//   embed.tokens (V, C)       wte.weight                 embed_tokens.weight
//   embed.positions (T, C)    wpe.weight                 -
//   layers.N.norm1            h.N.ln_1                   layers.N.input_layernorm
//   layers.N.attn.qkv (C, [q|k|v])  h.N.attn.c_attn (as is)  self_attn.{q,k,v}_proj (columns, transposed)
//   layers.N.attn.out (HD, C) h.N.attn.c_proj (as is)    self_attn.o_proj (transposed)
//   layers.N.norm2            h.N.ln_2                   layers.N.post_attention_layernorm
//   layers.N.mlp.up (C, [gate|up])  h.N.mlp.c_fc (as is)  mlp.{gate,up}_proj (columns, transposed)
//   layers.N.mlp.down (F, C)  h.N.mlp.c_proj (as is)     mlp.down_proj (transposed)
//   final_norm                ln_f                       norm
//   layers.N.moe.router (C, E)  -                        layers.N.block_sparse_moe.gate (transposed)
//   layers.N.moe.up (E, C, [gate|up])  -                 block_sparse_moe.experts.e.{w1,w3} (split, transposed)
//   layers.N.moe.down (E, F, C)  -                       block_sparse_moe.experts.e.w2 (transposed)
//   head (C, V), untied only  lm_head.weight (V, C)      lm_head.weight (V, C)
//
// Rotary embeddings: meshtrain's rope (backends/backend.h) rotates the
// adjacent pairs (2i, 2i+1) of a head, Hugging Face's Llama the pairs (i,
// i + D/2) (rotate_half), both by position · theta^(-2i/D). Exporting q and
// k permutes each head's rows so that HF row half·D/2 + i is meshtrain column
// 2i + half (the permutation of HF's convert_llama_weights_to_hf.py); then
// both compute the same attention scores.
//
// A tied GPT-2 or Llama head is written as HF's save_pretrained writes it:
// the embedding alone, tie_word_embeddings true.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "engine/export/safetensors.h"
#include "models/model_spec.h"

namespace meshtrain {

enum class HfArch { gpt2, llama, mixtral };

// The Hugging Face architecture of `m`, or an Error saying why it has none
// (a vision or VQA model, experts, a mix of GPT-2 and Llama features, ...).
Result<HfArch> hf_arch(const ModelSpec& m);
std::string_view hf_arch_name(HfArch a);  // "GPT-2", "Llama", "Mixtral"

// One Hugging Face tensor: columns [column, column + columns) of meshtrain
// parameter `param` (rows × cols, or a vector: 1 × cols; for an expert's
// matrix, the rows × cols starting at element `base`), transposed or not,
// each head of `rope_head_dim` columns permuted from adjacent to half pairs.
struct HfTensorMap {
  std::string hf_name;
  std::vector<std::int64_t> hf_shape;
  std::string param;
  std::int64_t param_numel = 0;     // elements of the whole parameter
  std::int64_t base = 0;            // the matrix's first element in the parameter
  std::int64_t rows = 1, cols = 0;  // the meshtrain parameter (or expert), as a matrix
  std::int64_t column = 0, columns = 0;
  bool transpose = false;
  std::int64_t rope_head_dim = 0;  // 0: no permutation

  std::int64_t numel() const { return rows * columns; }
  // The flat index into the meshtrain parameter of element `k` of the HF tensor.
  std::int64_t source(std::int64_t k) const;
};

// Every HF tensor of `m` in model order. Assumes hf_arch(m) succeeded.
std::vector<HfTensorMap> hf_tensor_maps(const ModelSpec& m, HfArch arch);

// config.json as transformers writes it for this architecture (GPT2Config or
// LlamaConfig keys), with torch_dtype of the exported weights.
nlohmann::json hf_config(const ModelSpec& m, HfArch arch, SafeDType dtype);

// Refuses a config.json (read from `path`) that describes another model than
// `m`, naming each mismatched key with both values.
Status check_hf_config(const nlohmann::json& config, const ModelSpec& m, const std::string& path);

}  // namespace meshtrain
