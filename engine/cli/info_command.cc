// `meshtrain info`: the model, the plan, a rank's groups and its memory.
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/input_file.h"
#include "engine/cli/bounded_flags.h"
#include "engine/cli/commands.h"
#include "engine/cli/plan_flags.h"
#include "engine/memory/memory_model.h"
#include "engine/plan/mesh.h"
#include "engine/plan/segment_plan.h"
#include "models/block.h"
#include "models/flops.h"
#include "models/model_io.h"
#include "models/parameters.h"

namespace meshtrain {

namespace {

struct InfoFlags {
  PlanFlags plan;
  int rank = 0;
  bool json = false;
};

// A plan made of segments: the blocks, which ranks hold which with which
// degrees, and the memory of rank f.rank in each of its segments.
Status print_segments(const ModelSpec& m, const Plan& p, const InfoFlags& f) {
  const ParamCount params = count_parameters(m);
  nlohmann::json per_segment = nlohmann::json::array();
  std::string memory;
  for (std::size_t k = 0; k < p.segments.size(); ++k) {
    const Plan& s = p.segments[k];
    if (!s.holds_rank(f.rank)) continue;
    const Coord c = Mesh(s).coord_of(f.rank);
    const MemoryBreakdown mem = memory_per_rank(m, s, c.pp, meshtrain_layout(s));
    per_segment.push_back({{"segment", k},
                           {"name", s.segment_name},
                           {"coord", {{"tp", c.tp}, {"dp", c.dp}, {"pp", c.pp}}},
                           {"parameter_count", mem.parameter_count},
                           {"total_bytes", mem.total()}});
    memory += fmt::format("  segment {} '{}': tp {} dp {} stage {}, {} parameters, {} (parameters {}, gradients "
                          "{}, optimizer {}, activations {})\n",
                          k, s.segment_name, c.tp, c.dp, c.pp, mem.parameter_count, human_bytes(mem.total()),
                          human_bytes(mem.parameters), human_bytes(mem.gradients), human_bytes(mem.optimizer),
                          human_bytes(mem.activations));
  }
  if (f.json) {
    const nlohmann::json j = {{"model", model_to_json(m)}, {"parameters", params.total},
                              {"plan", plan_to_json(p)},   {"rank", f.rank},
                              {"segments", per_segment}};
    fmt::print("{}\n", j.dump(2));
    return {};
  }
  fmt::print("model      {}\n", describe_model(m));
  fmt::print("parameters {}\n", params.total);
  fmt::print("blocks\n{}", describe_blocks(m));
  fmt::print("segments   {} ranks, global batch {}, seq {}, {}\n{}", p.world_size(), p.effective_global_batch(),
             p.effective_seq_len(m), precision_name(p.precision), describe_segments(p, m));
  fmt::print("memory of rank {}:\n{}", f.rank, memory);
  return {};
}

// The model's modules (BlockDef::module, the names a plan's segments use) in
// block order, each with its first and last block index.
struct ModuleBlocks {
  std::string name;
  int first = 0, last = 0;
};
std::vector<ModuleBlocks> module_blocks(const ModelSpec& m) {
  std::vector<ModuleBlocks> out;
  const ModelBlocks blocks = model_blocks(m);
  for (int i = 0; i < static_cast<int>(blocks.size()); ++i) {
    const std::string& name = blocks[static_cast<std::size_t>(i)]->module();
    if (out.empty() || out.back().name != name) out.push_back({name, i, i});
    out.back().last = i;
  }
  return out;
}

Status run_info(const InfoFlags& f) {
  MT_ASSIGN(ModelAndPlan mp, resolve_model_and_plan(f.plan));
  const ModelSpec& m = mp.model;
  const Plan& p = mp.plan;
  if (f.rank < 0 || f.rank >= p.world_size())
    return make_error("--rank {} is outside the world of {} ranks (tp·pp·dp·cp); use 0..{}", f.rank,
                      p.world_size(), p.world_size() - 1);
  if (!p.segments.empty()) return print_segments(m, p, f);
  const Mesh mesh(p);
  const Coord c = mesh.coord_of(f.rank);
  const ParamCount params = count_parameters(m);
  const int seq = p.effective_seq_len(m);
  const FlopCount flops = training_flops(m, p.effective_global_batch(), seq, p.recompute);
  const MemoryBreakdown mem = memory_per_rank(m, p, c.pp, meshtrain_layout(p));
  const std::vector<ModuleBlocks> modules = module_blocks(m);

  if (f.json) {
    nlohmann::json groups = nlohmann::json::object();
    for (int k = 0; k < kGroupKinds; ++k) {
      const Group* g = mesh.group_of(static_cast<GroupKind>(k), f.rank);
      groups[group_kind_name(static_cast<GroupKind>(k))] = g ? nlohmann::json(g->ranks) : nlohmann::json();
    }
    nlohmann::json j = {
        {"model", model_to_json(m)},
        {"modules", nlohmann::json::array()},
        {"parameters", params.total},
        {"embedding_parameters", params.embedding},
        {"active_parameters", params.active},
        {fmt::format("flops_per_{}", model_io(m).unit()), flops.per_token},
        {"model_flops_per_iteration", flops.model},
        {"hardware_flops_per_iteration", flops.hardware},
        {"plan", plan_to_json(p)},
        {"rank", f.rank},
        {"coord", {{"tp", c.tp}, {"cp", c.cp}, {"dp", c.dp}, {"pp", c.pp}}},
        {"groups", groups},
        {"memory",
         {{"parameter_count", mem.parameter_count},
          {"parameters_bytes", mem.parameters},
          {"gradients_bytes", mem.gradients},
          {"optimizer_bytes", mem.optimizer},
          {"zero3_working_bytes", mem.zero3_working},
          {"offloaded_bytes", mem.offloaded},
          {"host_bytes", mem.host},
          {"activations_bytes", mem.activations},
          {"inflight_microbatches", mem.inflight},
          {"total_bytes", mem.total()}}}};
    for (const ModuleBlocks& mb : modules)
      j["modules"].push_back({{"name", mb.name}, {"first_block", mb.first}, {"last_block", mb.last}});
    fmt::print("{}\n", j.dump(2));
    return {};
  }
  fmt::print("model      {}\n", describe_model(m));
  std::string names;
  for (const ModuleBlocks& mb : modules)
    names += fmt::format("{}{} ({})", names.empty() ? "" : ", ", mb.name,
                         mb.first == mb.last ? fmt::format("block {}", mb.first)
                                             : fmt::format("blocks {}-{}", mb.first, mb.last));
  fmt::print("modules    {}\n", names);
  fmt::print("parameters {} ({} without embeddings)\n", params.total, params.non_embedding());
  if (model_io(m).routes_to_experts)
    fmt::print("           {} active per token ({} in experts, top {} of {})\n", params.active, params.expert, m.top_k,
               m.experts);
  fmt::print("FLOPs      {:.4g} per {}, {:.4g} per iteration (hardware {:.4g} with recompute {})\n",
             flops.per_token, model_io(m).unit(), flops.model, flops.hardware, recompute_name(p.recompute));
  fmt::print("plan       tp {} pp {} dp {} cp {} ep {} etp {} vpp {} zero {}, {} ranks; micro-batch {} x {} = global "
             "batch {}, seq {}; schedule {}, recompute {}, {}{}{}\n",
             p.tp, p.pp, p.dp, p.cp, p.ep, p.expert_tp(), p.vpp, p.zero, p.world_size(), p.micro_batch,
             p.microbatches() * p.dp,
             p.effective_global_batch(), seq, schedule_name(p.schedule), recompute_name(p.recompute),
             precision_name(p.precision), p.sequence_parallel ? ", sequence parallel" : "",
             p.tp_comm_overlap ? ", tp comm overlap" : "");
  fmt::print("rank {}     tp {} cp {} dp {} pp {}", f.rank, c.tp, c.cp, c.dp, c.pp);
  if (model_io(m).routes_to_experts) {
    const auto index = [&](GroupKind k) { return mesh.group_of(k, f.rank)->index_of(f.rank); };
    fmt::print("; expert tp {} ep {} edp {} (experts {}..{})", index(GroupKind::expert_tensor),
               index(GroupKind::expert), index(GroupKind::expert_data), index(GroupKind::expert) * m.experts / p.ep,
               (index(GroupKind::expert) + 1) * m.experts / p.ep - 1);
  }
  fmt::print("\n");
  for (int k = 0; k < kGroupKinds; ++k) {
    const Group* g = mesh.group_of(static_cast<GroupKind>(k), f.rank);
    fmt::print("  {:<15} {}\n", group_kind_name(static_cast<GroupKind>(k)),
               g ? fmt::format("[{}]", fmt::join(g->ranks, ",")) : std::string("(not a member)"));
  }
  fmt::print("memory of rank {} (stage {}, {} parameters):\n", f.rank, c.pp, mem.parameter_count);
  fmt::print("  parameters      {:>12}\n", human_bytes(mem.parameters));
  fmt::print("  gradients       {:>12}\n", human_bytes(mem.gradients));
  fmt::print("  optimizer       {:>12}\n", human_bytes(mem.optimizer));
  if (p.zero >= 3) fmt::print("  zero-3 gathered {:>12}\n", human_bytes(mem.zero3_working));
  fmt::print("  activations     {:>12}  ({} micro-batches in flight)\n", human_bytes(mem.activations), mem.inflight);
  fmt::print("  total           {:>12}\n", human_bytes(mem.total()));
  if (p.offload != Offload::none)
    fmt::print("  offload {}: device memory saved {}, host memory {}\n", offload_name(p.offload),
               human_bytes(mem.offloaded), human_bytes(mem.host));
  return {};
}

}  // namespace

Command add_info_command(CLI::App& app) {
  auto flags = std::make_shared<InfoFlags>();
  CLI::App* sub = app.add_subcommand("info", "model size, FLOPs, plan, process groups and memory per rank");
  add_plan_flags(*sub, flags->plan, "gpt2-124m");
  sub->add_option("--rank", flags->rank, "global rank whose groups and memory to show")
      ->capture_default_str()
      ->check(int_in({0, kMaxWorldSize - 1}));
  sub->add_flag("--json", flags->json, "print one JSON object");
  return {sub, [flags] { return run_info(*flags); }};
}

}  // namespace meshtrain
