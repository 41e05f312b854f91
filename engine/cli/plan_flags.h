// Command-line flags shared by the subcommands that take a model and a plan.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "engine/cli/bounded_flags.h"
#include "engine/plan/plan.h"
#include "engine/simulation/simulation.h"
#include "models/model_spec.h"

namespace meshtrain {

struct PlanFlags {
  std::string model = "gpt2-124m";
  std::string plan_file;
  PlanOverrides overrides;
};

// Adds --model, --plan FILE and one flag per plan field (--tp, --pp, ...).
void add_plan_flags(CLI::App& app, PlanFlags& flags, const std::string& default_model);

// Adds --cluster (a preset name or JSON file) and --gpus (1 to kMaxWorldSize,
// described by `gpus_help`), the pair every command that sizes a cluster
// takes; returns --gpus for a command that requires it.
template <class Gpus>
CLI::Option* add_cluster_flags(CLI::App& app, std::string& cluster, Gpus& gpus, const std::string& gpus_help) {
  app.add_option("--cluster", cluster, "cluster preset name or JSON file")->capture_default_str();
  return app.add_option("--gpus", gpus, gpus_help)->check(int_in({1, kMaxWorldSize}));
}

// The software of the run being simulated: its attention, loss and expert
// kernels, its dropout, how its tokens spread over experts and cross the
// expert group (SimulateOptions). simulate, plan and compare take the same
// flags, read the same way.
struct SoftwareFlags {
  std::string attention = "flash", cross_entropy = "fused", moe_routing = "uniform", moe_dispatcher = "alltoall";
  float dropout = 0.f;
  bool moe_sequential_experts = false;
};
// Adds --attention, --cross-entropy, --dropout, --moe-routing, --moe-dispatcher and --moe-sequential-experts.
void add_software_flags(CLI::App& app, SoftwareFlags& flags);
// Sets `options`' software stack from the flags; an unknown name is an Error listing the known ones.
Status apply_software_flags(const SoftwareFlags& flags, SimulateOptions& options);

// With `gpus` > 0 and no dp given (flag or plan file): dp fills the GPUs
// left by the model-parallel dimensions, gpus / (tp·pp·cp).
Status dp_from_gpus(PlanFlags& flags, int gpus);

struct ModelAndPlan {
  ModelSpec model;
  Plan plan;
};
// Loads the model, applies the plan file then the flags, and validates
// against `world_size` (0: the plan's own).
Result<ModelAndPlan> resolve_model_and_plan(const PlanFlags& flags, int world_size = 0);

}  // namespace meshtrain
