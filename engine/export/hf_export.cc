#include "engine/export/hf_export.h"

#include <cmath>
#include <filesystem>
#include <set>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/input_file.h"
#include "core/json_input.h"
#include "engine/checkpoint/checkpoint.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

// Larger than any model meshtrain trains on a host; the whole file is read.
constexpr std::size_t kMaxSafetensorsBytes = std::size_t{1} << 40;
constexpr std::string_view kParamsPrefix = "params/";

std::string shape_text(const std::vector<std::int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// "a, b, c and 4 more"
std::string name_list(const std::vector<std::string>& names) {
  constexpr std::size_t kShown = 6;
  const auto count = static_cast<std::ptrdiff_t>(std::min(names.size(), kShown));
  const std::vector<std::string> shown(names.begin(), names.begin() + count);
  std::string out = fmt::format("{}", fmt::join(shown, ", "));
  if (names.size() > kShown) out += fmt::format(" and {} more", names.size() - kShown);
  return out;
}

// GPT-2 files saved from the base model (GPT2Model, as the original hub
// checkpoint) name tensors without "transformer."; its attention mask
// buffers (attn.bias, attn.masked_bias) are constants, not parameters.
std::string canonical_name(HfArch arch, const std::string& name) {
  if (arch != HfArch::gpt2 || name.rfind("transformer.", 0) == 0 || name == "lm_head.weight") return name;
  return "transformer." + name;
}
bool is_gpt2_buffer(HfArch arch, const std::string& name) {
  auto ends_with = [&](std::string_view s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return arch == HfArch::gpt2 && (ends_with(".attn.bias") || ends_with(".attn.masked_bias"));
}

// A tied model's file may still carry lm_head.weight (some writers keep it): it must be the embedding.
Status check_tied_head(const SafeTensor& head, const std::vector<float>& embedding, const std::string& path) {
  if (to_float32(head) != embedding)
    return make_error("'{}': tensor 'lm_head.weight' differs from the token embedding, but the model ties them; "
                      "use a model with \"tied_embeddings\": false", path);
  return ok_status();
}

Status check_finite(const std::string& name, const std::vector<float>& values, const std::string& path) {
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]))
      return make_error("'{}': tensor '{}' holds {} at element {}; a model cannot start from it", path, name,
                        values[i], i);
  return ok_status();
}

}  // namespace

Result<std::vector<SafeTensor>> to_hf_tensors(const ModelSpec& m, const ParamMap& params, SafeDType dtype) {
  MT_ASSIGN(const HfArch arch, hf_arch(m));
  std::vector<SafeTensor> out;
  for (const HfTensorMap& map : hf_tensor_maps(m, arch)) {
    const auto it = params.find(map.param);
    if (it == params.end()) return make_error("the parameters of '{}' have no '{}'", m.name, map.param);
    if (static_cast<std::int64_t>(it->second.size()) != map.param_numel)
      return make_error("parameter '{}' has {} values, model '{}' needs {}", map.param, it->second.size(), m.name,
                        map.param_numel);
    std::vector<float> values(static_cast<std::size_t>(map.numel()));
    for (std::int64_t k = 0; k < map.numel(); ++k)
      values[static_cast<std::size_t>(k)] = it->second[static_cast<std::size_t>(map.source(k))];
    out.push_back({map.hf_name, dtype, map.hf_shape, from_float32(values, dtype)});
  }
  return out;
}

Result<std::string> encode_hf_safetensors(const ModelSpec& m, const ParamMap& params, SafeDType dtype) {
  MT_ASSIGN(const std::vector<SafeTensor> tensors, to_hf_tensors(m, params, dtype));
  return encode_safetensors(tensors, {{"format", "pt"}});
}

Result<ParamMap> from_hf_tensors(const ModelSpec& m, const SafetensorsFile& file, const std::string& path) {
  MT_ASSIGN(const HfArch arch, hf_arch(m));
  std::map<std::string, const SafeTensor*> by_name;
  for (const SafeTensor& t : file.tensors)
    if (!by_name.emplace(canonical_name(arch, t.name), &t).second)
      return make_error("'{}' holds tensor '{}' twice (with and without the \"transformer.\" prefix)", path,
                        canonical_name(arch, t.name));
  const std::vector<HfTensorMap> maps = hf_tensor_maps(m, arch);
  std::vector<std::string> missing, misshaped;
  ParamMap params;
  for (const HfTensorMap& map : maps) {
    const auto it = by_name.find(map.hf_name);
    if (it == by_name.end()) {
      missing.push_back(map.hf_name);
      continue;
    }
    const SafeTensor& t = *it->second;
    if (t.shape != map.hf_shape) {
      misshaped.push_back(
          fmt::format("'{}' is {}, expected {}", t.name, shape_text(t.shape), shape_text(map.hf_shape)));
      continue;
    }
    const std::vector<float> values = to_float32(t);
    MT_TRY(check_finite(t.name, values, path));
    std::vector<float>& p = params[map.param];
    p.resize(static_cast<std::size_t>(map.param_numel));
    for (std::int64_t k = 0; k < map.numel(); ++k)
      p[static_cast<std::size_t>(map.source(k))] = values[static_cast<std::size_t>(k)];
    by_name.erase(it);
  }
  const auto head = by_name.find("lm_head.weight");
  if (m.tied_embeddings && head != by_name.end() && missing.empty() && misshaped.empty()) {
    MT_TRY(check_tied_head(*head->second, params.at("embed.tokens"), path));
    by_name.erase(head);
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, t] : by_name)
    if (!is_gpt2_buffer(arch, name)) unexpected.push_back(t->name);
  std::vector<std::string> problems;
  if (!missing.empty()) problems.push_back(fmt::format("missing tensors {}", name_list(missing)));
  if (!misshaped.empty()) problems.push_back(fmt::format("shapes differ: {}", name_list(misshaped)));
  if (!unexpected.empty()) problems.push_back(fmt::format("unexpected tensors {}", name_list(unexpected)));
  if (problems.empty()) return params;
  return make_error("'{}' does not hold the {} parameters of model '{}' ({}): {}; pass the --model it was exported "
                    "from", path, hf_arch_name(arch), m.name, describe_model(m), fmt::join(problems, "; "));
}

ParamMap initial_training_state(const ParamMap& params) {
  ParamMap state;
  for (const auto& [name, values] : params) {
    state.emplace(std::string(kParamsPrefix) + name, values);
    state.emplace("adam_m/" + name, std::vector<float>(values.size(), 0.f));
    state.emplace("adam_v/" + name, std::vector<float>(values.size(), 0.f));
  }
  return state;
}

Result<CheckpointParams> load_checkpoint_params(const std::string& dir) {
  MT_ASSIGN(Checkpoint c, load_checkpoint(dir));
  CheckpointParams out;
  MT_ASSIGN(out.model, model_from_json(c.meta.model).context(fmt::format("checkpoint in '{}'", dir)));
  out.step = c.meta.step;
  for (auto& [name, t] : c.tensors)
    if (name.rfind(kParamsPrefix, 0) == 0) out.params.emplace(name.substr(kParamsPrefix.size()), std::move(t.data));
  return out;
}

ExportPaths export_paths(const std::string& out) {
  const fs::path p(out);
  std::error_code ec;
  if (p.extension() == ".safetensors" && !fs::is_directory(p, ec))
    return {p.string(), (p.parent_path() / "config.json").string()};
  return {(p / "model.safetensors").string(), (p / "config.json").string()};
}

Result<ExportPaths> export_checkpoint(const std::string& dir, const std::string& out, SafeDType dtype) {
  MT_ASSIGN(const CheckpointParams c, load_checkpoint_params(dir));
  MT_ASSIGN(const HfArch arch, hf_arch(c.model).context(fmt::format("checkpoint in '{}'", dir)));
  MT_ASSIGN(const std::string bytes, encode_hf_safetensors(c.model, c.params, dtype));
  const ExportPaths paths = export_paths(out);
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec) && fs::path(out).extension() != ".safetensors")
    return make_error("--out '{}' is a file; name a directory (for model.safetensors and config.json) or a "
                      "FILE.safetensors", out);
  const fs::path parent = fs::path(paths.safetensors).parent_path();
  if (!parent.empty() && !fs::exists(parent, ec) && !fs::create_directories(parent, ec))
    return make_error("cannot create directory '{}' for --out: {}", parent.string(), ec.message());
  MT_TRY(write_output_file(paths.safetensors, bytes, "safetensors file"));
  MT_TRY(write_output_file(paths.config, hf_config(c.model, arch, dtype).dump(2) + "\n", "config.json"));
  return paths;
}

Result<ParamMap> load_hf_parameters(const std::string& path, const ModelSpec& m) {
  MT_ASSIGN(const std::string bytes, read_input_file(path, "safetensors file", kMaxSafetensorsBytes));
  MT_ASSIGN(const SafetensorsFile file, decode_safetensors(bytes, path));
  const fs::path config = fs::path(path).parent_path() / "config.json";
  std::error_code ec;
  if (fs::is_regular_file(config, ec)) {
    MT_ASSIGN(const nlohmann::json j, load_json_file(config.string(), "Hugging Face config"));
    MT_TRY(check_hf_config(j, m, config.string()));
  }
  return from_hf_tensors(m, file, path);
}

}  // namespace meshtrain
