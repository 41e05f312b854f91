#include "engine/step/fp8_training.h"

#include <fmt/format.h>

namespace meshtrain {

Status check_fp8_emulation(const ModelSpec& m, const Plan& p) {
  if (p.precision != Precision::fp8 || p.fp8_recipe != Fp8Recipe::current || m.experts == 0 || p.ep == 1)
    return ok_status();
  // The expert mesh (engine/plan/mesh.h) numbers a stage's ranks tp fastest, then cp, then dp, and
  // lays ETP·EP consecutive ones into an expert group's block.
  const int etp = p.expert_tp();
  const int shared = p.tp * p.cp;
  if (etp * p.ep <= shared && shared % (etp * p.ep) == 0) return ok_status();
  return make_error("fp8_recipe current with ep {} (etp {}) over tp {} and cp {}: an expert group then takes "
                    "tokens from several data-parallel ranks' micro-batches into one grouped GEMM, whose one "
                    "current scale the single-rank run cannot reproduce, so the cpu backend does not emulate it; "
                    "train with --fp8-recipe delayed, or an ep·etp that divides tp·cp = {}, or time it with "
                    "`meshtrain simulate`",
                    p.ep, etp, p.tp, p.cp, shared);
}

Status fold_fp8_amax(Backend& b, std::span<Fp8Scaling* const> chunks, std::span<const Group* const> groups) {
  // A chunk without FP8 linears (an embedding-only stage) has no amax tensor.
  auto size = [](const Fp8Scaling* c) -> std::int64_t { return c->amax().defined() ? c->amax().numel() : 0; };
  std::int64_t total = 0;
  for (const Fp8Scaling* c : chunks) total += size(c);
  std::vector<float> amax(static_cast<std::size_t>(total));
  // Every rank of a group holds the same layers, so the same layout (possibly empty).
  if (total > 0) {
    Tensor t = b.empty(Shape{total});
    std::int64_t at = 0;
    for (const Fp8Scaling* c : chunks)
      if (const std::int64_t n = size(c); n > 0) {
        Tensor part = t.slice(at, n);
        b.copy(c->amax(), part);
        at += n;
      }
    for (const Group* g : groups)
      if (g->size() > 1) b.all_reduce(t, *g, ReduceOp::max);
    MT_TRY(b.read(t, amax));
  }
  std::size_t at = 0;
  for (Fp8Scaling* c : chunks) {
    const auto n = static_cast<std::size_t>(size(c));
    MT_TRY(c->end_step(std::span<const float>(amax).subspan(at, n)));
    at += n;
  }
  return ok_status();
}

std::string fp8_state_name(const std::string& linear) { return "fp8/" + linear; }

std::vector<std::pair<std::string, std::int64_t>> fp8_state_sizes(const ModelSpec& m, const Plan& p) {
  std::vector<std::pair<std::string, std::int64_t>> out;
  if (p.precision != Precision::fp8 || p.fp8_recipe != Fp8Recipe::delayed) return out;
  for (const ParamInfo& info : parameter_table(m))
    if (is_fp8_linear(info) && p.stage_split().holds(m, info.layer))
      out.push_back({fp8_state_name(fp8_linear_name(info)), kFp8Operands * (kDefaultAmaxHistory + 1)});
  return out;
}

Status export_fp8_state(Backend& b, const ModelSpec& m, const Plan& p, const Mesh& mesh,
                        std::span<Fp8Scaling* const> chunks, std::map<std::string, std::vector<float>>& out) {
  if (p.fp8_recipe != Fp8Recipe::delayed) return ok_status();
  std::size_t size = 0;
  for (const Fp8Scaling* c : chunks) {
    size = c->state_size();
    for (const std::string& linear : c->linears()) out[fp8_state_name(linear)] = c->state(linear);
  }
  if (p.pp == 1) return ok_status();
  const Coord me = mesh.coord_of(b.rank());
  const Group& pipe = *mesh.group_of(GroupKind::pipeline, b.rank());
  for (const ParamInfo& info : parameter_table(m)) {
    if (!is_fp8_linear(info) || !p.stage_split().holds(m, info.layer)) continue;
    const int owner = place_layer(m, info.layer, p.stage_split()).stage;
    const std::string name = fp8_state_name(fp8_linear_name(info));
    Tensor t = b.empty(Shape{static_cast<std::int64_t>(size)});
    if (owner == me.pp) b.write(t, out.at(name));
    b.broadcast(t, pipe, mesh.rank_of({me.tp, me.cp, me.dp, owner}));
    std::vector<float> host(size);
    MT_TRY(b.read(t, host));
    out[name] = std::move(host);
  }
  return ok_status();
}

Status import_fp8_state(std::span<Fp8Scaling* const> chunks, const std::map<std::string, std::vector<float>>& state) {
  for (Fp8Scaling* c : chunks) {
    if (c->recipe() != Fp8Recipe::delayed) continue;
    for (const std::string& linear : c->linears()) {
      auto it = state.find(fp8_state_name(linear));
      if (it == state.end())
        return make_error("the checkpoint has no tensor '{}', the FP8 scaling state a run with delayed scaling "
                          "keeps; one saved by another precision or by --fp8-recipe current (which keeps none) "
                          "resumes with that precision and recipe",
                          fp8_state_name(linear));
      MT_TRY(c->restore(linear, it->second));
    }
  }
  return ok_status();
}

}  // namespace meshtrain
