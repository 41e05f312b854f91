#include "engine/planner/search_space.h"

#include <algorithm>
#include <cstdint>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/bounded.h"
#include "core/names.h"
#include "models/model_io.h"

namespace meshtrain::planner {

namespace {

// Largest micro-batch searched by default: past it activations dominate and
// GEMMs are long saturated; --allow micro_batch=... searches beyond.
constexpr int kMaxDefaultMicroBatch = 128;
// Model chunks per stage searched by default (Megatron-LM's runs use 2 to 4).
constexpr int kMaxDefaultVpp = 8;

std::vector<int> divisors(int n, int up_to) {
  std::vector<int> out;
  for (int d = 1; d <= std::min(n, up_to); ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

Result<int> parse_in(std::string_view text, IntRange range) {
  MT_ASSIGN(std::int64_t v, parse_int("", text, range));
  return static_cast<int>(v);
}
Result<int> parse_count(std::string_view text) { return parse_in(text, {1, kMaxWorldSize}); }
Result<int> parse_layers(std::string_view text) { return parse_in(text, {0, 65536}); }
Result<int> parse_zero(std::string_view text) { return parse_in(text, {0, 3}); }
std::string format_int(int v) { return std::to_string(v); }

Result<int> parse_switch(std::string_view text) {
  if (text == "on" || text == "1" || text == "true") return 1;
  if (text == "off" || text == "0" || text == "false") return 0;
  return make_error("'{}' is not on or off (also 1/0, true/false)", text);
}
std::string format_switch(int v) { return v ? "on" : "off"; }

Result<int> parse_recompute_value(std::string_view text) {
  MT_ASSIGN(Recompute r, parse_recompute(std::string(text)));
  return static_cast<int>(r);
}
std::string format_recompute(int v) { return recompute_name(static_cast<Recompute>(v)); }

Result<int> parse_schedule_value(std::string_view text) {
  MT_ASSIGN(ScheduleKind s, parse_schedule(std::string(text)));
  return static_cast<int>(s);
}
std::string format_schedule(int v) { return schedule_name(static_cast<ScheduleKind>(v)); }

// etp is 1 (whole experts) or tp; the plan's 0 means tp, and is written so.
Result<int> parse_etp(std::string_view text) {
  if (text == "tp") return 0;
  return parse_in(text, {0, kMaxWorldSize});
}
std::string format_etp(int v) { return v == 0 ? "tp" : std::to_string(v); }

std::vector<int> tp_defaults(const SearchContext& c, const Plan&) {
  // Powers of two up to a node: a tensor-parallel group beyond NVLink pays
  // the network on every layer (--allow tp=16 searches it anyway).
  std::vector<int> out;
  for (int t = 1; t <= std::min(c.gpus_per_node, c.gpus); t *= 2)
    if (c.gpus % t == 0) out.push_back(t);
  return out;
}

std::vector<int> pp_defaults(const SearchContext& c, const Plan& p) {
  const std::int64_t tp_cp = std::int64_t{p.tp} * p.cp;
  if (c.gpus % tp_cp != 0) return {};
  return divisors(static_cast<int>(c.gpus / tp_cp), c.model.layers);
}

// Powers of two that leave each rank kMinContextTokens (search_space.h) and
// divide the sequence into 2·cp chunks (check_context_split); only decoders
// without experts split their sequence (validate_plan).
std::vector<int> cp_defaults(const SearchContext& c, const Plan& p) {
  std::vector<int> out = {1};
  const ModelIo io = model_io(c.model);
  if (io.tokens_fixed_by_model || io.routes_to_experts) return out;
  const int seq = c.base.effective_seq_len(c.model);
  for (int cp = 2; seq / cp >= kMinContextTokens && std::int64_t{p.tp} * cp <= c.gpus; cp *= 2)
    if (c.gpus % (p.tp * cp) == 0 && seq % (2 * cp) == 0) out.push_back(cp);
  return out;
}

Result<int> parse_cp_comm(std::string_view text) {
  MT_ASSIGN(ContextComm comm, parse_context_comm(std::string(text)));
  return static_cast<int>(comm);
}
std::string format_cp_comm(int v) { return context_comm_name(static_cast<ContextComm>(v)); }
std::vector<int> cp_comm_defaults(const SearchContext&, const Plan&) {
  return {static_cast<int>(ContextComm::all_gather), static_cast<int>(ContextComm::ring)};
}
bool has_cp(const SearchContext&, const Plan& p) { return p.cp > 1; }

// The ranks holding the same parameters (the gradient reduction's group).
bool has_replicas(const SearchContext&, const Plan& p) { return p.dp * p.cp > 1; }

// Reducing once per step only differs from once per micro-batch with several of them, under ZeRO 2/3.
bool reduces_per_microbatch(const SearchContext& c, const Plan& p) {
  return p.zero >= 2 && has_replicas(c, p) && p.microbatches() > 1;
}
bool gathers_parameters(const SearchContext& c, const Plan& p) { return p.zero == 3 && has_replicas(c, p); }
std::vector<int> off_and_on(const SearchContext&, const Plan&) { return {0, 1}; }
std::vector<int> on_only(const SearchContext&, const Plan&) { return {1}; }

Result<int> parse_compression(std::string_view text) {
  MT_ASSIGN(GradCompression g, parse_grad_compression(std::string(text)));
  return static_cast<int>(g);
}
std::string format_compression(int v) { return grad_compression_name(static_cast<GradCompression>(v)); }
std::vector<int> compression_defaults(const SearchContext&, const Plan&) {
  return {static_cast<int>(GradCompression::none)};
}

Result<int> parse_offload_value(std::string_view text) {
  MT_ASSIGN(Offload o, parse_offload(std::string(text)));
  return static_cast<int>(o);
}
std::string format_offload(int v) { return offload_name(static_cast<Offload>(v)); }
std::vector<int> offload_defaults(const SearchContext&, const Plan& p) {
  std::vector<int> out = {static_cast<int>(Offload::none), static_cast<int>(Offload::optimizer)};
  if (p.zero == 3) out.push_back(static_cast<int>(Offload::params));
  return out;
}
bool without_offload(const SearchContext&, const Plan& p) { return p.offload == Offload::none; }
bool keeps_fp8_parameters(const SearchContext&, const Plan& p) { return p.precision == Precision::fp8 && p.zero >= 1; }
bool interleaves(const SearchContext&, const Plan& p) { return p.pp > 1 && p.schedule == ScheduleKind::interleaved; }

// Recompute modules as one value: bit 0 layernorm, bit 1 moe_act, written
// "none" or the names joined by '+' (',' separates --allow's values).
int modules_value(const RecomputeModules& r) { return (r.layernorm ? 1 : 0) | (r.moe_act ? 2 : 0); }
RecomputeModules modules_of(int v) { return {(v & 1) != 0, (v & 2) != 0}; }
Result<int> parse_modules_value(std::string_view text) {
  if (text == "none") return 0;
  std::vector<std::string> names;
  for (std::size_t start = 0; start <= text.size();) {
    const std::size_t plus = std::min(text.find('+', start), text.size());
    names.emplace_back(text.substr(start, plus - start));
    start = plus + 1;
  }
  MT_ASSIGN(RecomputeModules r, parse_recompute_modules(names));
  return modules_value(r);
}
std::string format_modules(int v) {
  const std::vector<std::string> names = recompute_module_names(modules_of(v));
  return names.empty() ? "none" : fmt::format("{}", fmt::join(names, "+"));
}
// Only the base plan's (--recompute-modules): they trade time for memory a
// plan that fits does not need, so other sets are searched when allowed.
std::vector<int> modules_defaults(const SearchContext& c, const Plan&) {
  return {modules_value(c.base.recompute_modules)};
}
// Where a module exists to recompute: MoE layers, not already recomputed whole.
bool has_modules(const SearchContext& c, const Plan& p) {
  return model_io(c.model).routes_to_experts && p.recompute != Recompute::full;
}

// EP all-to-all overlap where the plan can pair its passes (validate_plan's
// own check) and has a steady state: more micro-batches than stages (with as
// many, interleaving runs every forward first; pp 1 needs two).
bool pairs_passes(const SearchContext&, const Plan& p) {
  Plan overlapped = p;
  overlapped.moe_a2a_overlap = true;
  return p.microbatches() > p.pp && check_a2a_overlap(overlapped).ok();
}

std::vector<int> dp_defaults(const SearchContext& c, const Plan& p) {
  const std::int64_t model_parallel = std::int64_t{p.tp} * p.pp * p.cp;
  if (c.gpus % model_parallel != 0) return {};
  return {static_cast<int>(c.gpus / model_parallel)};
}

std::vector<int> vpp_defaults(const SearchContext& c, const Plan& p) {
  std::vector<int> out = {1};
  if (p.pp == 1) return out;
  for (int v = 2; v <= kMaxDefaultVpp; ++v)
    if (c.model.layers % (p.pp * v) == 0) out.push_back(v);
  return out;
}

std::vector<int> schedule_defaults(const SearchContext&, const Plan& p) {
  // 1F1B holds fewer activations than GPipe in the same time; interleaving is the only schedule with chunks.
  return {static_cast<int>(p.vpp > 1 ? ScheduleKind::interleaved : ScheduleKind::one_f_one_b)};
}

std::vector<int> micro_batch_defaults(const SearchContext& c, const Plan& p) {
  const int batch = c.base.effective_global_batch();
  if (batch % p.dp != 0) return {};
  return divisors(batch / p.dp, kMaxDefaultMicroBatch);
}

std::vector<int> zero_defaults(const SearchContext&, const Plan& p) {
  if (p.dp == 1) return {0};
  return {0, 1, 2, 3};
}

// Selective recomputation recomputes the attention core to drop its
// materialised scores; meshtrain's attention keeps only the row statistics
// (memory_model.h, meshtrain_layout), so selective saves nothing and costs
// time: it is dominated and searched only when allowed.
std::vector<int> recompute_defaults(const SearchContext&, const Plan&) {
  return {static_cast<int>(Recompute::none), static_cast<int>(Recompute::full)};
}

std::vector<int> sp_defaults(const SearchContext&, const Plan& p) {
  if (p.tp == 1) return {0};
  return {0, 1};
}

std::vector<int> ep_defaults(const SearchContext& c, const Plan& p) {
  if (!model_io(c.model).routes_to_experts) return {1};
  return divisors(std::gcd(c.model.experts, p.dp), c.model.experts);
}

std::vector<int> etp_defaults(const SearchContext& c, const Plan& p) {
  if (!model_io(c.model).routes_to_experts || p.tp == 1) return {0};
  return {0, 1};
}

// Megatron-Core's uneven pipeline ends: the first (last) stage takes fewer
// layers to make room for the embedding (head); one fewer than an even share.
std::vector<int> end_stage_defaults(const SearchContext& c, const Plan& p) {
  std::vector<int> out = {0};
  if (p.pp < 3 || p.vpp > 1) return out;
  const int even = c.model.layers / p.pp;
  if (even > 1) out.push_back(even - 1);
  return out;
}

const std::vector<Dimension> kDimensions = {
    {"tp", "tensor parallel degree (default: powers of two up to a node)", false, tp_defaults,
     [](Plan& p, int v) { p.tp = v; }, [](const Plan& p) { return p.tp; }, parse_count, format_int},
    {"cp", "context parallel degree (default: 1, and powers of two leaving each rank >= 4096 tokens; decoders)",
     false, cp_defaults, [](Plan& p, int v) { p.cp = v; }, [](const Plan& p) { return p.cp; }, parse_count,
     format_int},
    {"cp_comm", "context parallel key/value exchange: allgather, ring (default: both, where cp > 1)", false,
     cp_comm_defaults, [](Plan& p, int v) { p.cp_comm = static_cast<ContextComm>(v); },
     [](const Plan& p) { return static_cast<int>(p.cp_comm); }, parse_cp_comm, format_cp_comm, has_cp},
    {"pp", "pipeline stages (default: divisors of gpus/(tp·cp) up to the layers)", false, pp_defaults,
     [](Plan& p, int v) { p.pp = v; }, [](const Plan& p) { return p.pp; }, parse_count, format_int},
    {"dp", "data parallel degree (derived: gpus / (tp·pp·cp))", true, dp_defaults, [](Plan& p, int v) { p.dp = v; },
     [](const Plan& p) { return p.dp; }, parse_count, format_int},
    {"vpp", "model chunks per stage (default: 1 to 8 dividing the layers per stage)", false, vpp_defaults,
     [](Plan& p, int v) { p.vpp = v; }, [](const Plan& p) { return p.vpp; }, parse_count, format_int},
    {"schedule", "pipeline schedule (default: 1f1b, interleaved when vpp > 1)", false, schedule_defaults,
     [](Plan& p, int v) { p.schedule = static_cast<ScheduleKind>(v); },
     [](const Plan& p) { return static_cast<int>(p.schedule); }, parse_schedule_value, format_schedule},
    {"micro_batch", "sequences per micro-batch (default: divisors of global batch / dp up to 128)", false,
     micro_batch_defaults, [](Plan& p, int v) { p.micro_batch = v; }, [](const Plan& p) { return p.micro_batch; },
     parse_count, format_int},
    {"zero", "ZeRO stage (default: 0 to 3; 0 when dp is 1)", false, zero_defaults, [](Plan& p, int v) { p.zero = v; },
     [](const Plan& p) { return p.zero; }, parse_zero, format_int},
    {"zero_reduce_once", "ZeRO 2/3: reduce gradients once per step, not per micro-batch (default: off, on)", false,
     off_and_on, [](Plan& p, int v) { p.zero_reduce_once = v != 0; },
     [](const Plan& p) { return p.zero_reduce_once ? 1 : 0; }, parse_switch, format_switch, reduces_per_microbatch},
    {"prefetch_across_chunks", "ZeRO 3: prefetch the next action's first layer across chunks (default: on)", false,
     on_only, [](Plan& p, int v) { p.prefetch_across_chunks = v != 0; },
     [](const Plan& p) { return p.prefetch_across_chunks ? 1 : 0; }, parse_switch, format_switch,
     gathers_parameters},
    {"recompute", "activation recomputation (default: none, full; selective saves nothing with meshtrain's attention)", false, recompute_defaults,
     [](Plan& p, int v) { p.recompute = static_cast<Recompute>(v); },
     [](const Plan& p) { return static_cast<int>(p.recompute); }, parse_recompute_value, format_recompute},
    {"sequence_parallel", "sequence parallelism (default: off, on when tp > 1)", false, sp_defaults,
     [](Plan& p, int v) { p.sequence_parallel = v != 0; }, [](const Plan& p) { return p.sequence_parallel ? 1 : 0; },
     parse_switch, format_switch},
    {"ep", "expert parallel degree (MoE; default: divisors of experts and dp)", false, ep_defaults,
     [](Plan& p, int v) { p.ep = v; }, [](const Plan& p) { return p.ep; }, parse_count, format_int},
    {"etp", "expert tensor parallel: tp or 1 (MoE with tp > 1)", false, etp_defaults,
     [](Plan& p, int v) { p.etp = v; }, [](const Plan& p) { return p.etp; }, parse_etp, format_etp},
    {"first_stage_layers", "layers on the first stage (0: even; default also one fewer than even, pp >= 3)", false,
     end_stage_defaults, [](Plan& p, int v) { p.first_stage_layers = v; },
     [](const Plan& p) { return p.first_stage_layers; }, parse_layers, format_int},
    {"last_stage_layers", "layers on the last stage (as first_stage_layers)", false, end_stage_defaults,
     [](Plan& p, int v) { p.last_stage_layers = v; }, [](const Plan& p) { return p.last_stage_layers; },
     parse_layers, format_int},
    {"grad_compression",
     "data-parallel gradients on the wire: none, bf16, fp16, 1bit (default: none; the others change the "
     "gradients' values, so they are searched only when --allow lists them)",
     false, compression_defaults, [](Plan& p, int v) { p.grad_compression = static_cast<GradCompression>(v); },
     [](const Plan& p) { return static_cast<int>(p.grad_compression); }, parse_compression, format_compression,
     has_replicas},
    {"offload", "optimizer state (and ZeRO 3 parameters) in host memory: none, optimizer, params (default: all; "
     "an offload plan is kept only where the same plan without offload does not fit)",
     false, offload_defaults, [](Plan& p, int v) { p.offload = static_cast<Offload>(v); },
     [](const Plan& p) { return static_cast<int>(p.offload); }, parse_offload_value, format_offload},
    {"overlap_update", "optimizer step overlapped with the next forward, bucket by bucket (default: on without "
     "offload)", false, on_only, [](Plan& p, int v) { p.overlap_update = v != 0; },
     [](const Plan& p) { return p.overlap_update ? 1 : 0; }, parse_switch, format_switch, without_offload},
    {"fp8_param_gather", "FP8 linears' weights kept and all-gathered as FP8 parameters (default: on with precision "
     "fp8 and ZeRO 1-3, as Megatron-Bridge's FP8 recipes run; simulated only)", false, on_only,
     [](Plan& p, int v) { p.fp8_param_gather = v != 0; }, [](const Plan& p) { return p.fp8_param_gather ? 1 : 0; },
     parse_switch, format_switch, keeps_fp8_parameters},
    {"overlap_p2p_comm", "interleaved schedule: pipeline receives posted ahead, under compute (default: on where it "
     "applies, as Megatron-Core and Megatron-Bridge run the interleaved schedule)", false, on_only,
     [](Plan& p, int v) { p.overlap_p2p_comm = v != 0; }, [](const Plan& p) { return p.overlap_p2p_comm ? 1 : 0; },
     parse_switch, format_switch, interleaves},
    {"recompute_modules", "MoE: modules recomputed in backward: none, layernorm, moe_act, layernorm+moe_act "
     "(default: --recompute-modules' only; not with recompute full)", false, modules_defaults,
     [](Plan& p, int v) { p.recompute_modules = modules_of(v); },
     [](const Plan& p) { return modules_value(p.recompute_modules); }, parse_modules_value, format_modules,
     has_modules},
    {"moe_a2a_overlap", "MoE: each forward's expert all-to-alls hidden under another micro-batch's backward "
     "(default: off, on where ep > 1 and the schedule pairs passes)", false, off_and_on,
     [](Plan& p, int v) { p.moe_a2a_overlap = v != 0; }, [](const Plan& p) { return p.moe_a2a_overlap ? 1 : 0; },
     parse_switch, format_switch, pairs_passes},
};

// Two pinned values the engine cannot combine: when `a` is pinned to a value
// a_is accepts, `b` must be pinned to one b_allows accepts.
struct PinConflict {
  const char* a;
  bool (*a_is)(int);
  const char* b;
  bool (*b_allows)(int);
  const char* why;
};
const PinConflict kPinConflicts[] = {
    {"offload", [](int v) { return v == static_cast<int>(Offload::params); }, "zero", [](int z) { return z == 3; },
     "offload params keeps ZeRO 3's parameter shards on the host and needs zero 3"},
    {"zero_reduce_once", [](int v) { return v != 0; }, "zero", [](int z) { return z >= 2; },
     "zero_reduce_once needs zero 2 or 3 (ZeRO 0 and 1 already reduce once per step)"},
    {"grad_compression", [](int v) { return v == static_cast<int>(GradCompression::one_bit); }, "zero",
     [](int z) { return z <= 1; }, "1bit compression needs zero 0 or 1"},
    {"overlap_update", [](int v) { return v != 0; }, "offload",
     [](int o) { return o == static_cast<int>(Offload::none); },
     "overlap_update does not combine with offload (the offloaded update already runs off the compute stream)"},
    {"cp_comm", [](int v) { return v == static_cast<int>(ContextComm::ring); }, "cp", [](int c) { return c > 1; },
     "cp_comm ring exchanges keys and values between context ranks and needs cp > 1"},
    {"overlap_p2p_comm", [](int v) { return v != 0; }, "schedule",
     [](int s) { return s == static_cast<int>(ScheduleKind::interleaved); },
     "overlap_p2p_comm posts the interleaved schedule's receives ahead and needs schedule interleaved"},
    {"overlap_p2p_comm", [](int v) { return v != 0; }, "pp", [](int pp) { return pp > 1; },
     "overlap_p2p_comm overlaps pipeline receives and needs pp > 1"},
    {"fp8_param_gather", [](int v) { return v != 0; }, "zero", [](int z) { return z >= 1; },
     "fp8_param_gather keeps FP8 parameters in the distributed optimizer and needs zero 1, 2 or 3"},
};

std::vector<std::string> dimension_names() {
  std::vector<std::string> names;
  for (const Dimension& d : kDimensions) names.push_back(d.name);
  return names;
}

struct Item {
  std::size_t dim;
  std::vector<int> values;
  std::string text;  // as written, for messages
};

Result<std::vector<Item>> parse_items(const std::string& flag, const std::string& spec) {
  std::vector<Item> items;
  std::size_t start = 0;
  while (start <= spec.size()) {
    const std::size_t comma = std::min(spec.find(',', start), spec.size());
    const std::string token = spec.substr(start, comma - start);
    start = comma + 1;
    if (token.empty()) return make_error("{} '{}': an empty item; write name=value[,value...]", flag, spec);
    const std::size_t eq = token.find('=');
    std::string value = token;
    if (eq != std::string::npos) {
      MT_ASSIGN(const Dimension* d, find_dimension(token.substr(0, eq)).context(fmt::format("{} '{}'", flag, spec)));
      items.push_back({static_cast<std::size_t>(d - kDimensions.data()), {}, token});
      value = token.substr(eq + 1);
    } else if (items.empty()) {
      return make_error("{} '{}': '{}' has no dimension; write name=value, e.g. tp=8", flag, spec, token);
    } else {
      items.back().text += "," + token;
    }
    const Dimension& d = kDimensions[items.back().dim];
    auto v = d.parse(value);
    if (!v) return make_error("{} '{}': {} value '{}': {}", flag, spec, d.name, value, v.error().message());
    items.back().values.push_back(*v);
  }
  return items;
}

}  // namespace

const std::vector<Dimension>& dimensions() { return kDimensions; }

Result<const Dimension*> find_dimension(std::string_view name) {
  for (const Dimension& d : kDimensions)
    if (name == d.name) return &d;
  return Error(unknown_name_message("plan dimension", name, dimension_names()));
}

namespace {

// The index in kDimensions of a dimension the code names (a programming error if there is none).
std::size_t dimension_index(std::string_view name) {
  return static_cast<std::size_t>(find_dimension(name).value() - kDimensions.data());
}

}  // namespace

std::vector<int> SearchSpace::values(std::size_t dim, const SearchContext& ctx, const Plan& partial) const {
  const Dimension& d = kDimensions[dim];
  // Where the field means nothing, one value: a pin as given (validate_plan
  // judges it), else the base plan's, which gives the same plan as any other.
  if (d.applies != nullptr && !d.applies(ctx, partial)) {
    if (allowed[dim] && allowed[dim]->size() == 1) return *allowed[dim];
    return {d.get(ctx.base)};
  }
  std::vector<int> defaults = d.defaults(ctx, partial);
  if (!allowed[dim]) return defaults;
  if (!d.derived) return *allowed[dim];
  std::vector<int> out;
  for (int v : defaults)
    if (std::find(allowed[dim]->begin(), allowed[dim]->end(), v) != allowed[dim]->end()) out.push_back(v);
  return out;
}

std::string SearchSpace::describe_fixed() const {
  std::string out;
  for (std::size_t i = 0; i < kDimensions.size(); ++i)
    if (allowed[i] && allowed[i]->size() == 1)
      out += fmt::format("{}{}={}", out.empty() ? "" : " ", kDimensions[i].name, kDimensions[i].format(allowed[i]->front()));
  return out;
}

std::optional<int> SearchSpace::pinned(std::string_view name) const {
  const std::optional<std::vector<int>>& values = allowed[dimension_index(name)];
  if (values && values->size() == 1) return values->front();
  return std::nullopt;
}

Result<SearchSpace> parse_search_space(const std::vector<std::string>& fix, const std::vector<std::string>& allow,
                                       const SearchContext& ctx) {
  SearchSpace space;
  std::vector<std::optional<std::string>> fixed_by(kDimensions.size());
  for (const std::string& spec : allow) {
    MT_ASSIGN(std::vector<Item> items, parse_items("--allow", spec));
    for (Item& item : items) {
      std::sort(item.values.begin(), item.values.end());
      item.values.erase(std::unique(item.values.begin(), item.values.end()), item.values.end());
      space.allowed[item.dim] = item.values;
    }
  }
  for (const std::string& spec : fix) {
    MT_ASSIGN(std::vector<Item> items, parse_items("--fix", spec));
    for (const Item& item : items) {
      const Dimension& d = kDimensions[item.dim];
      if (item.values.size() != 1)
        return make_error("--fix {}: a --fix pins one value; to search several use --allow {}", item.text, item.text);
      const int v = item.values.front();
      if (fixed_by[item.dim]) {
        if (space.allowed[item.dim]->front() != v)
          return make_error("--fix {} and --fix {} contradict: {} can only take one value", *fixed_by[item.dim],
                            item.text, d.name);
        continue;
      }
      if (space.allowed[item.dim] &&
          std::find(space.allowed[item.dim]->begin(), space.allowed[item.dim]->end(), v) == space.allowed[item.dim]->end())
      {
        std::vector<std::string> listed;  // as --allow spells them: "on", not 1
        for (int a : *space.allowed[item.dim]) listed.push_back(d.format(a));
        return make_error("--fix {} is outside --allow's list for {} ({}); drop one of them", item.text, d.name,
                          fmt::join(listed, ","));
      }
      space.allowed[item.dim] = std::vector<int>{v};
      fixed_by[item.dim] = item.text;
    }
  }
  // The degrees that multiply into the world: caught here with their names
  // rather than as an empty search.
  std::int64_t product = 1;
  std::string named;
  for (const char* name : {"tp", "cp", "pp", "dp"}) {
    const std::size_t i = dimension_index(name);
    if (!fixed_by[i]) continue;
    product *= space.allowed[i]->front();
    named += fmt::format("{}{}", named.empty() ? "" : " and --fix ", *fixed_by[i]);
    if (product > ctx.gpus || ctx.gpus % product != 0)
      return make_error("--fix {} needs a multiple of {} GPUs, but --gpus is {}; change the fixed degrees or --gpus",
                        named, product, ctx.gpus);
  }
  const std::size_t tp = dimension_index("tp"), cp = dimension_index("cp"), pp = dimension_index("pp"),
                    dp = dimension_index("dp");
  if (fixed_by[tp] && fixed_by[pp] && fixed_by[dp] && product != ctx.gpus) {
    // Unless the context-parallel degree left free can make up the rest.
    Plan partial = ctx.base;
    partial.tp = space.allowed[tp]->front();
    const std::vector<int> cps = fixed_by[cp] ? std::vector<int>{} : space.values(cp, ctx, partial);
    if (std::find(cps.begin(), cps.end(), ctx.gpus / product) == cps.end())
      return make_error("--fix {} make {} = {} ranks, but --gpus is {}", named,
                        fixed_by[cp] ? "tp·cp·pp·dp" : "tp·pp·dp", product, ctx.gpus);
  }
  // Pins of two fields the engine does not combine (validate_plan's rules), named before any search.
  for (const PinConflict& c : kPinConflicts) {
    const std::size_t a = dimension_index(c.a), b = dimension_index(c.b);
    if (fixed_by[a] && fixed_by[b] && c.a_is(space.allowed[a]->front()) && !c.b_allows(space.allowed[b]->front()))
      return make_error("--fix {} and --fix {} contradict: {}; drop or change one of them", *fixed_by[a],
                        *fixed_by[b], c.why);
  }
  // Every candidate keeps the job's gradient dtype, and the compressors read fp32 gradients.
  const std::optional<std::vector<int>>& compression = space.allowed[dimension_index("grad_compression")];
  if (ctx.base.grad_dtype != GradDtype::fp32 && compression &&
      std::any_of(compression->begin(), compression->end(),
                  [](int v) { return v != static_cast<int>(GradCompression::none); }))
    return make_error("--grad-dtype {} does not combine with gradient compression, which reads and writes fp32 "
                      "gradients; drop grad_compression from --fix/--allow, or use --grad-dtype fp32",
                      grad_dtype_name(ctx.base.grad_dtype));
  return space;
}

}  // namespace meshtrain::planner
