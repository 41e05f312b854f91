#include "engine/plan.h"

#include "models/block.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/names.h"

namespace meshtrain {

namespace {

const std::vector<std::string> kRecomputes = {"none", "selective", "full"};
const std::vector<std::string> kPrecisions = {"fp32", "bf16", "fp16"};
const std::vector<std::string> kGradSyncs = {"overlap", "after-backward"};
const std::vector<std::string> kPlanFields = {"tp",        "pp",        "dp",           "cp",
                                              "ep",        "etp",       "vpp",       "zero",         "micro_batch",
                                              "global_batch", "seq_len", "recompute",   "schedule",
                                              "precision", "sequence_parallel",
                                              "first_stage_layers", "last_stage_layers",
                                              "microbatches", "grad_bucket_mb", "grad_sync"};

template <class E>
Result<E> parse_enum(const char* what, const std::string& s, const std::vector<std::string>& names) {
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == s) return static_cast<E>(i);
  return Error(unknown_name_message(what, s, names));
}

constexpr double kMaxGradBucketMb = 1 << 20;

// Expert parallelism (engine/mesh.h's expert mesh) on an MoE model.
Status validate_expert_plan(const Plan& p, const ModelSpec& m) {
  const int etp = p.expert_tp();
  if (p.etp < 0 || (etp != 1 && etp != p.tp))
    return make_error("etp {} must be 1 (whole experts) or tp {} (experts split like the dense MLP)", p.etp, p.tp);
  if (m.experts % p.ep != 0)
    return make_error("experts {} are not divisible by ep {}; use an ep that divides {}", m.experts, p.ep,
                      m.experts);
  if (etp == p.tp && p.dp % p.ep != 0)
    return make_error("ep {} must divide dp {}: expert parallel groups are carved out of the data-parallel ranks "
                      "(tp·pp·dp = {}·{}·{} = {} ranks); use an ep that divides {}, or more data-parallel ranks",
                      p.ep, p.dp, p.tp, p.pp, p.dp, p.world_size(), p.dp);
  if (etp == 1 && (p.tp * p.dp) % p.ep != 0)
    return make_error("ep {} must divide tp·dp = {}·{} = {}: with etp 1 the expert groups take the tensor- and "
                      "data-parallel ranks of a stage; use an ep that divides {}",
                      p.ep, p.tp, p.dp, p.tp * p.dp, p.tp * p.dp);
  if (m.ffn % etp != 0)
    return make_error("expert ffn width {} is not divisible by etp {}; use etp 1 or a tp that divides {}", m.ffn,
                      etp, m.ffn);
  if (m.shared_experts > 0 && (m.ffn * m.shared_experts) % p.tp != 0)
    return make_error("shared experts' width {} (shared_experts {} · ffn {}) is not divisible by tp {}",
                      m.ffn * m.shared_experts, m.shared_experts, m.ffn, p.tp);
  const int rows = p.micro_batch * p.effective_seq_len(m);
  if (p.tp > 1 && rows % p.tp != 0)
    return make_error("each tp rank dispatches its share of a micro-batch's micro_batch·seq_len = {}·{} = {} tokens "
                      "to the experts, which tp {} does not divide",
                      p.micro_batch, p.effective_seq_len(m), rows, p.tp);
  return ok_status();
}

}  // namespace

std::string schedule_name(ScheduleKind s) { return std::string(schedule::schedule_kind_name(s)); }
std::string recompute_name(Recompute r) { return kRecomputes[static_cast<std::size_t>(r)]; }
std::string precision_name(Precision p) { return kPrecisions[static_cast<std::size_t>(p)]; }
Result<ScheduleKind> parse_schedule(const std::string& s) { return schedule::parse_schedule_kind(s); }
Result<Recompute> parse_recompute(const std::string& s) { return parse_enum<Recompute>("recompute mode", s, kRecomputes); }
Result<Precision> parse_precision(const std::string& s) { return parse_enum<Precision>("precision", s, kPrecisions); }
std::string grad_sync_name(GradSync g) { return kGradSyncs[static_cast<std::size_t>(g)]; }
Result<GradSync> parse_grad_sync(const std::string& s) {
  return parse_enum<GradSync>("gradient sync mode", s, kGradSyncs);
}

int element_bytes(Precision p) { return p == Precision::fp32 ? 4 : 2; }

Result<PlanOverrides> plan_overrides_from_json(const nlohmann::json& j) {
  if (!j.is_object()) return make_error("a plan must be a JSON object with fields such as tp, pp, dp");
  PlanOverrides o;
  for (auto& [key, value] : j.items()) {
    bool known = false;
    for (auto& f : kPlanFields) known = known || f == key;
    if (!known) return Error(unknown_name_message("plan field", key, kPlanFields));
  }
  auto get_int = [&](const char* key, std::optional<int>& out) -> Status {
    if (!j.contains(key)) return {};
    if (!j[key].is_number_integer())
      return make_error("plan field '{}' must be an integer, got {}", key, j[key].dump());
    out = j[key].get<int>();
    return {};
  };
  auto get_string = [&](const char* key, std::optional<std::string>& out) -> Status {
    if (!j.contains(key)) return {};
    if (!j[key].is_string()) return make_error("plan field '{}' must be a string, got {}", key, j[key].dump());
    out = j[key].get<std::string>();
    return {};
  };
  MT_TRY(get_int("tp", o.tp));
  MT_TRY(get_int("pp", o.pp));
  MT_TRY(get_int("dp", o.dp));
  MT_TRY(get_int("cp", o.cp));
  MT_TRY(get_int("ep", o.ep));
  MT_TRY(get_int("etp", o.etp));
  MT_TRY(get_int("vpp", o.vpp));
  MT_TRY(get_int("zero", o.zero));
  MT_TRY(get_int("micro_batch", o.micro_batch));
  MT_TRY(get_int("global_batch", o.global_batch));
  MT_TRY(get_int("microbatches", o.microbatches));
  MT_TRY(get_int("seq_len", o.seq_len));
  MT_TRY(get_int("first_stage_layers", o.first_stage_layers));
  MT_TRY(get_int("last_stage_layers", o.last_stage_layers));
  MT_TRY(get_string("recompute", o.recompute));
  MT_TRY(get_string("schedule", o.schedule));
  MT_TRY(get_string("precision", o.precision));
  MT_TRY(get_string("grad_sync", o.grad_sync));
  if (j.contains("grad_bucket_mb")) {
    if (!j["grad_bucket_mb"].is_number())
      return make_error("plan field 'grad_bucket_mb' must be a number of MiB, got {}", j["grad_bucket_mb"].dump());
    o.grad_bucket_mb = j["grad_bucket_mb"].get<double>();
  }
  if (j.contains("sequence_parallel")) {
    if (!j["sequence_parallel"].is_boolean())
      return make_error("plan field 'sequence_parallel' must be true or false, got {}", j["sequence_parallel"].dump());
    o.sequence_parallel = j["sequence_parallel"].get<bool>();
  }
  return o;
}

Result<PlanOverrides> plan_overrides_from_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error("cannot open plan file '{}'", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    return make_error("plan file '{}' is not valid JSON: {}", path, e.what());
  }
  auto o = plan_overrides_from_json(j);
  o.context(fmt::format("plan file '{}'", path));
  return o;
}

Result<Plan> apply_overrides(Plan p, const PlanOverrides& o) {
  auto set = [](int& dst, const std::optional<int>& v) {
    if (v) dst = *v;
  };
  set(p.tp, o.tp);
  set(p.pp, o.pp);
  set(p.dp, o.dp);
  set(p.cp, o.cp);
  set(p.ep, o.ep);
  set(p.etp, o.etp);
  set(p.vpp, o.vpp);
  set(p.zero, o.zero);
  set(p.micro_batch, o.micro_batch);
  set(p.global_batch, o.global_batch);
  set(p.seq_len, o.seq_len);
  set(p.first_stage_layers, o.first_stage_layers);
  set(p.last_stage_layers, o.last_stage_layers);
  if (o.recompute) {
    MT_ASSIGN(p.recompute, parse_recompute(*o.recompute));
  }
  if (o.schedule) {
    MT_ASSIGN(p.schedule, parse_schedule(*o.schedule));
  }
  if (o.precision) {
    MT_ASSIGN(p.precision, parse_precision(*o.precision));
  }
  if (o.grad_sync) {
    MT_ASSIGN(p.grad_sync, parse_grad_sync(*o.grad_sync));
  }
  if (o.grad_bucket_mb) p.grad_bucket_mb = *o.grad_bucket_mb;
  if (o.sequence_parallel) p.sequence_parallel = *o.sequence_parallel;
  if (o.microbatches) {
    if (*o.microbatches <= 0) return make_error("microbatches must be positive, got {}", *o.microbatches);
    const int global = p.micro_batch * p.dp * *o.microbatches;
    if (o.global_batch && *o.global_batch != global)
      return make_error("global batch {} and {} micro-batches disagree: micro_batch·dp·microbatches = {}·{}·{} = {}; "
                        "give one of them", *o.global_batch, *o.microbatches, p.micro_batch, p.dp, *o.microbatches,
                        global);
    p.global_batch = global;
  }
  return p;
}

Status validate_plan(const Plan& p, const ModelSpec& m, int world_size) {
  struct Size {
    const char* name;
    int value;
  };
  for (Size s : {Size{"tp", p.tp}, Size{"pp", p.pp}, Size{"dp", p.dp}, Size{"cp", p.cp}, Size{"ep", p.ep},
                 Size{"vpp", p.vpp}, Size{"micro_batch", p.micro_batch}})
    if (s.value <= 0) return make_error("{} must be positive, got {}", s.name, s.value);
  if (p.global_batch < 0) return make_error("global_batch must be positive, got {}", p.global_batch);
  if (p.seq_len < 0) return make_error("seq_len must be positive, got {}", p.seq_len);
  if (p.zero < 0 || p.zero > 3)
    return make_error("zero stage must be 0, 1, 2 or 3, got {}", p.zero);
  // The upper bound keeps the element count far from overflow; 1 TiB is larger than any stage's gradients.
  if (!(p.grad_bucket_mb > 0 && p.grad_bucket_mb <= kMaxGradBucketMb))
    return make_error("grad_bucket_mb (--grad-bucket-mb) must be a positive number of MiB up to {}, got {}; "
                      "use e.g. 25 (PyTorch DDP's bucket_cap_mb) or leave it out for the engine's 4",
                      kMaxGradBucketMb, p.grad_bucket_mb);
  if (p.grad_sync == GradSync::after_backward && p.zero >= 2)
    return make_error("grad_sync (--grad-sync) after-backward needs zero 0 or 1, got zero {}: ZeRO 2 and 3 "
                      "reduce each layer's gradients during backward to free them; use --grad-sync overlap",
                      p.zero);
  if (world_size > 0 && world_size != p.world_size())
    return make_error("world size {} != tp·pp·dp·cp = {}·{}·{}·{} = {}; set dp = {} or change tp/pp/cp",
                      world_size, p.tp, p.pp, p.dp, p.cp, p.world_size(),
                      world_size % (p.tp * p.pp * p.cp) == 0 ? world_size / (p.tp * p.pp * p.cp) : 0);
  if (m.vision()) {
    // Every layer splits its own heads (a Swin stage's differ from the next's).
    for (const auto& block : model_blocks(m)) MT_TRY(block->check_tensor_parallel(p.tp));
    if (p.seq_len != 0 && p.seq_len != m.seq_len)
      return make_error("seq_len {} given for the vision model '{}', whose images make {} tokens; leave seq_len out",
                        p.seq_len, m.name, m.seq_len);
    if (p.sequence_parallel)
      for (const auto& block : model_blocks(m))
        for (const std::int64_t tokens : {block->io(m.seq_len).tokens_in, block->io(m.seq_len).tokens_out})
          if (tokens > 1 && (p.micro_batch * tokens) % p.tp != 0)
            return make_error("sequence parallelism splits the micro_batch·tokens = {}·{} rows at layer {} over tp "
                              "{}, which does not divide them; choose a micro_batch that makes every layer's rows "
                              "a multiple of tp",
                              p.micro_batch, tokens, block->layer(), p.tp);
  } else {
    if (m.heads % p.tp != 0)
      return make_error("heads {} are not divisible by tp {}; use a tp that divides {}", m.heads, p.tp, m.heads);
    if (m.kv_heads % p.tp != 0)
      return make_error("kv_heads {} are not divisible by tp {}; use a tp that divides {}", m.kv_heads, p.tp,
                        m.kv_heads);
    // An MoE model's experts split over etp; its dense layers and shared experts over tp.
    const int mlp = m.moe() ? m.dense_mlp_width() : m.ffn;
    if (mlp % p.tp != 0)
      return make_error("ffn width {} is not divisible by tp {}; use a tp that divides {}", mlp, p.tp, mlp);
  }
  MT_TRY(check_stage_split(m, p.stage_split()));
  const int seq = p.effective_seq_len(m);
  if (seq > m.seq_len && m.position == PositionKind::learned)
    return make_error("seq_len {} exceeds the model's learned positions ({}); use seq_len <= {}", seq, m.seq_len,
                      m.seq_len);
  if (seq % p.cp != 0)
    return make_error("seq_len {} is not divisible by cp {}; choose cp dividing {}", seq, p.cp, seq);
  if (p.sequence_parallel && !m.vision() && seq % p.tp != 0)
    return make_error("sequence parallelism splits seq_len {} over tp {}, which does not divide it", seq, p.tp);
  const int per_step = p.micro_batch * p.dp;
  if (p.effective_global_batch() % per_step != 0)
    return make_error("global batch {} is not divisible by micro_batch·dp = {}·{} = {}; use a multiple of {}",
                      p.effective_global_batch(), p.micro_batch, p.dp, per_step, per_step);
  if (m.moe()) {
    MT_TRY(validate_expert_plan(p, m));
  } else if (p.ep != 1 || p.etp > 1) {
    return make_error("ep {} (etp {}) given for a dense model '{}' (no experts); use ep 1", p.ep, p.etp, m.name);
  }
  if (p.schedule == ScheduleKind::interleaved) {
    if (p.vpp < 2) return make_error("the interleaved schedule needs vpp >= 2 model chunks per stage, got vpp {}", p.vpp);
    if (p.pp < 2) return make_error("the interleaved schedule needs pp >= 2, got pp {}", p.pp);
    if (p.microbatches() % p.pp != 0)
      return make_error("the interleaved schedule needs micro-batches ({} = global batch {} / (micro_batch {} · dp "
                        "{})) to be a multiple of pp {}", p.microbatches(), p.effective_global_batch(),
                        p.micro_batch, p.dp, p.pp);
  } else if (p.vpp != 1) {
    return make_error("vpp {} needs the interleaved schedule (got {}); use --schedule interleaved or vpp 1", p.vpp,
                      schedule_name(p.schedule));
  }
  return {};
}

nlohmann::json plan_to_json(const Plan& p) {
  nlohmann::json j = {{"tp", p.tp},
          {"pp", p.pp},
          {"dp", p.dp},
          {"cp", p.cp},
          {"ep", p.ep},
          {"vpp", p.vpp},
          {"zero", p.zero},
          {"micro_batch", p.micro_batch},
          {"global_batch", p.effective_global_batch()},
          {"microbatches", p.microbatches()},
          {"seq_len", p.seq_len},
          {"recompute", recompute_name(p.recompute)},
          {"schedule", schedule_name(p.schedule)},
          {"precision", precision_name(p.precision)},
          {"sequence_parallel", p.sequence_parallel},
          {"world_size", p.world_size()}};
  // Only when set, so plans (and checkpoints) from before these fields read the same.
  if (p.first_stage_layers != 0) j["first_stage_layers"] = p.first_stage_layers;
  if (p.last_stage_layers != 0) j["last_stage_layers"] = p.last_stage_layers;
  if (p.grad_bucket_mb != Plan{}.grad_bucket_mb) j["grad_bucket_mb"] = p.grad_bucket_mb;
  if (p.grad_sync != GradSync::overlap) j["grad_sync"] = grad_sync_name(p.grad_sync);
  if (p.etp != 0) j["etp"] = p.etp;
  return j;
}

}  // namespace meshtrain
