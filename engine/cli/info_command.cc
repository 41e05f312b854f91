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
  fmt::print("segments   {} ranks, global batch {}, seq {}, {}{}\n{}", p.world_size(), p.effective_global_batch(),
             p.effective_seq_len(m), precision_label(p),
             grad_dtype_note(p),
             describe_segments(p, m));
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

// What `info` reports of a uniform plan's rank, computed once for both forms of output.
struct RankInfo {
  const ModelSpec& m;
  const Plan& p;
  const Mesh mesh;
  int rank = 0;
  Coord c;
  ParamCount params;
  int seq = 0;
  FlopCount flops;
  MemoryBreakdown mem;
  std::vector<ModuleBlocks> modules;

  RankInfo(const ModelSpec& model, const Plan& plan, int r)
      : m(model), p(plan), mesh(plan), rank(r), c(mesh.coord_of(r)), params(count_parameters(model)),
        seq(plan.effective_seq_len(model)),
        flops(training_flops(model, plan.effective_global_batch(), seq, plan.recompute)),
        mem(memory_per_rank(model, plan, c.pp, meshtrain_layout(plan))), modules(module_blocks(model)) {}
};

void print_json(const RankInfo& r) {
  const MemoryBreakdown& mem = r.mem;
  nlohmann::json groups = nlohmann::json::object();
  for (int k = 0; k < kGroupKinds; ++k) {
    const Group* g = r.mesh.group_of(static_cast<GroupKind>(k), r.rank);
    groups[group_kind_name(static_cast<GroupKind>(k))] = g ? nlohmann::json(g->ranks) : nlohmann::json();
  }
  nlohmann::json j = {
      {"model", model_to_json(r.m)},
      {"modules", nlohmann::json::array()},
      {"parameters", r.params.total},
      {"embedding_parameters", r.params.embedding},
      {"active_parameters", r.params.active},
      {fmt::format("flops_per_{}", model_io(r.m).unit()), r.flops.per_token},
      {"model_flops_per_iteration", r.flops.model},
      {"hardware_flops_per_iteration", r.flops.hardware},
      {"plan", plan_to_json(r.p)},
      {"rank", r.rank},
      {"coord", {{"tp", r.c.tp}, {"cp", r.c.cp}, {"dp", r.c.dp}, {"pp", r.c.pp}}},
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
  for (const ModuleBlocks& mb : r.modules)
    j["modules"].push_back({{"name", mb.name}, {"first_block", mb.first}, {"last_block", mb.last}});
  fmt::print("{}\n", j.dump(2));
}

// The model, its modules, parameters and FLOPs, and the plan, one line each.
void print_model_and_plan(const RankInfo& r) {
  const ModelSpec& m = r.m;
  const Plan& p = r.p;
  fmt::print("model      {}\n", describe_model(m));
  std::string names;
  for (const ModuleBlocks& mb : r.modules)
    names += fmt::format("{}{} ({})", names.empty() ? "" : ", ", mb.name,
                         mb.first == mb.last ? fmt::format("block {}", mb.first)
                                             : fmt::format("blocks {}-{}", mb.first, mb.last));
  fmt::print("modules    {}\n", names);
  fmt::print("parameters {} ({} without embeddings)\n", r.params.total, r.params.non_embedding());
  if (model_io(m).routes_to_experts)
    fmt::print("           {} active per token ({} in experts, top {} of {})\n", r.params.active, r.params.expert,
               m.top_k, m.experts);
  fmt::print("FLOPs      {:.4g} per {}, {:.4g} per iteration (hardware {:.4g} with recompute {})\n",
             r.flops.per_token, model_io(m).unit(), r.flops.model, r.flops.hardware, recompute_label(p));
  fmt::print("plan       tp {} pp {} dp {} cp {} ep {} etp {} vpp {} zero {}, {} ranks; micro-batch {} x {} = global "
             "batch {}, seq {}; schedule {}, recompute {}, {}{}{}{}{}{}\n",
             p.tp, p.pp, p.dp, p.cp, p.ep, p.expert_tp(), p.vpp, p.zero, p.world_size(), p.micro_batch,
             p.microbatches() * p.dp,
             p.effective_global_batch(), r.seq, schedule_name(p.schedule), recompute_label(p),
             precision_label(p), p.sequence_parallel ? ", sequence parallel" : "",
             p.tp_comm_overlap ? ", tp comm overlap" : "", p.moe_a2a_overlap ? ", EP all-to-all overlap" : "",
             p.overlap_p2p_comm ? ", pipeline p2p overlap" : "", grad_dtype_note(p));
}

// The rank's coordinates and groups, then its memory by kind.
void print_rank(const RankInfo& r) {
  const ModelSpec& m = r.m;
  const Plan& p = r.p;
  const MemoryBreakdown& mem = r.mem;
  fmt::print("rank {}     tp {} cp {} dp {} pp {}", r.rank, r.c.tp, r.c.cp, r.c.dp, r.c.pp);
  if (model_io(m).routes_to_experts) {
    const auto index = [&](GroupKind k) { return r.mesh.group_of(k, r.rank)->index_of(r.rank); };
    fmt::print("; expert tp {} ep {} edp {} (experts {}..{})", index(GroupKind::expert_tensor),
               index(GroupKind::expert), index(GroupKind::expert_data), index(GroupKind::expert) * m.experts / p.ep,
               (index(GroupKind::expert) + 1) * m.experts / p.ep - 1);
  }
  fmt::print("\n");
  for (int k = 0; k < kGroupKinds; ++k) {
    const Group* g = r.mesh.group_of(static_cast<GroupKind>(k), r.rank);
    fmt::print("  {:<15} {}\n", group_kind_name(static_cast<GroupKind>(k)),
               g ? fmt::format("[{}]", fmt::join(g->ranks, ",")) : std::string("(not a member)"));
  }
  fmt::print("memory of rank {} (stage {}, {} parameters):\n", r.rank, r.c.pp, mem.parameter_count);
  fmt::print("  parameters      {:>12}\n", human_bytes(mem.parameters));
  fmt::print("  gradients       {:>12}\n", human_bytes(mem.gradients));
  fmt::print("  optimizer       {:>12}\n", human_bytes(mem.optimizer));
  if (p.zero >= 3) fmt::print("  zero-3 gathered {:>12}\n", human_bytes(mem.zero3_working));
  fmt::print("  activations     {:>12}  ({} micro-batches in flight)\n", human_bytes(mem.activations), mem.inflight);
  fmt::print("  total           {:>12}\n", human_bytes(mem.total()));
  if (p.offload != Offload::none)
    fmt::print("  offload {}: device memory saved {}, host memory {}\n", offload_name(p.offload),
               human_bytes(mem.offloaded), human_bytes(mem.host));
}

Status run_info(const InfoFlags& f) {
  MT_ASSIGN(ModelAndPlan mp, resolve_model_and_plan(f.plan));
  const Plan& p = mp.plan;
  if (f.rank < 0 || f.rank >= p.world_size())
    return make_error("--rank {} is outside the world of {} ranks (tp·pp·dp·cp); use 0..{}", f.rank,
                      p.world_size(), p.world_size() - 1);
  if (!p.segments.empty()) return print_segments(mp.model, p, f);
  const RankInfo info(mp.model, p, f.rank);
  if (f.json) {
    print_json(info);
    return {};
  }
  print_model_and_plan(info);
  print_rank(info);
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
