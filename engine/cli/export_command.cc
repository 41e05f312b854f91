// `meshtrain export --checkpoint DIR --format safetensors --out DIR_OR_FILE
// [--dtype fp32|bf16]`: a checkpoint's parameters as a safetensors file with
// Hugging Face names and a config.json beside it (engine/export/hf_export.h),
// loadable by transformers' GPT2LMHeadModel, LlamaForCausalLM or
// MixtralForCausalLM and by
// `train --init-from`.
#include <memory>

#include <fmt/format.h>

#include "core/names.h"
#include "engine/cli/commands.h"
#include "engine/export/hf_export.h"

namespace meshtrain {

namespace {

struct ExportFlags {
  std::string checkpoint, format = "safetensors", out, dtype = "fp32";
};

Status run_export(const ExportFlags& f) {
  if (f.format != "safetensors") return Error(unknown_name_message("--format", f.format, {"safetensors"}));
  if (f.dtype != "fp32" && f.dtype != "bf16") return Error(unknown_name_message("--dtype", f.dtype, {"fp32", "bf16"}));
  const SafeDType dtype = f.dtype == "fp32" ? SafeDType::f32 : SafeDType::bf16;
  MT_ASSIGN(const ExportPaths paths, export_checkpoint(f.checkpoint, f.out, dtype));
  fmt::print("wrote {} and {}\n", paths.safetensors, paths.config);
  return {};
}

}  // namespace

Command add_export_command(CLI::App& app) {
  auto f = std::make_shared<ExportFlags>();
  CLI::App* sub = app.add_subcommand(
      "export",
      "write a checkpoint's weights as safetensors with Hugging Face names (GPT-2, Llama, Mixtral) and a config.json");
  sub->add_option("--checkpoint", f->checkpoint, "checkpoint directory (train --checkpoint)")->required();
  sub->add_option("--format", f->format, "output format (safetensors)")->capture_default_str();
  sub->add_option("--out", f->out,
                  "FILE.safetensors (config.json is written beside it) or a directory (model.safetensors and "
                  "config.json in it)")
      ->required();
  sub->add_option("--dtype", f->dtype, "fp32 (exact) or bf16 (rounded to nearest even)")->capture_default_str();
  return {sub, [f] { return run_export(*f); }};
}

}  // namespace meshtrain
