// Weights in and out as safetensors with Hugging Face names: `meshtrain
// export` writes a checkpoint's parameters (engine/export/hf_layout.h maps
// the names and layouts) with a config.json beside them, and `train
// --init-from` reads such a file back into a run's parameters.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/export/hf_layout.h"
#include "engine/export/safetensors.h"
#include "models/model_spec.h"

namespace meshtrain {

// Full (unsharded) parameters by meshtrain name ("layers.0.attn.qkv.weight"),
// flat row-major: what a checkpoint holds under "params/".
using ParamMap = std::map<std::string, std::vector<float>>;

// The HF tensors of `params` in `dtype`. An Error names a parameter that is
// missing or of the wrong size.
Result<std::vector<SafeTensor>> to_hf_tensors(const ModelSpec& m, const ParamMap& params, SafeDType dtype);
// The safetensors file of `params` (metadata {"format": "pt"}, as transformers writes it).
Result<std::string> encode_hf_safetensors(const ModelSpec& m, const ParamMap& params, SafeDType dtype);

// `m`'s parameters from a file's tensors (F32, BF16 or F16): every expected
// tensor present with its shape, nothing else (a GPT-2 file's attention mask
// buffers, and a tied lm_head equal to the embedding, are accepted and
// ignored). Missing, unexpected and mis-shaped tensors are named, each with
// the shape expected. `path` names the file in errors.
Result<ParamMap> from_hf_tensors(const ModelSpec& m, const SafetensorsFile& file, const std::string& path);

// What TrainingEngine::import_state takes to start from `params`: them as
// "params/<name>", with zero AdamW moments ("adam_m/", "adam_v/"), as a fresh
// run's optimizer has.
ParamMap initial_training_state(const ParamMap& params);

// The parameters of a checkpoint directory (engine/checkpoint) and its model.
struct CheckpointParams {
  ModelSpec model;
  std::int64_t step = 0;
  ParamMap params;
};
Result<CheckpointParams> load_checkpoint_params(const std::string& dir);

// Where an export goes: --out ending in .safetensors names the file, with
// config.json beside it; any other --out is a directory that receives
// model.safetensors and config.json.
struct ExportPaths {
  std::string safetensors, config;
};
ExportPaths export_paths(const std::string& out);

// Writes checkpoint `dir`'s parameters to `out` (export_paths), each file
// replaced atomically. Returns the paths written.
Result<ExportPaths> export_checkpoint(const std::string& dir, const std::string& out, SafeDType dtype);

// The parameters of `m` in safetensors file `path`, checked against the
// config.json beside it when there is one (check_hf_config).
Result<ParamMap> load_hf_parameters(const std::string& path, const ModelSpec& m);

}  // namespace meshtrain
