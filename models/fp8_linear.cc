#include "models/fp8_linear.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "backends/misuse.h"

namespace meshtrain {

namespace {

// Forward operands are E4M3, the output gradient E5M2 (Format.HYBRID).
Fp8Format format_of(int operand) {
  return operand == static_cast<int>(Fp8Operand::grad) ? Fp8Format::e5m2 : Fp8Format::e4m3;
}

}  // namespace

std::string fp8_linear_name(const ParamInfo& p) {
  // A routed experts' grouped weight (E, in, out) has no ".weight": it is named as its linear.
  if (p.expert) return p.name;
  return p.name.substr(0, p.name.size() - kWeightSuffix.size());
}

Fp8Scaling::Fp8Scaling(Backend& b, std::span<const ParamInfo> params, Fp8Recipe recipe, int history,
                       bool keep_weight_casts)
    : b_(b), recipe_(recipe), keep_weight_casts_(keep_weight_casts), history_(history) {
  for (const ParamInfo& p : params) {
    if (!is_fp8_linear(p)) continue;
    Linear l;
    for (int k = 0; k < kFp8Operands; ++k) {
      // `history` is the engine's own constant, never user input: a bad one is a programming error.
      auto scaling = DelayedScaling::make(format_of(k), history);
      if (!scaling) abort_misuse("Fp8Scaling", scaling.error().message());
      l.scaling.push_back(*scaling);
    }
    linears_.emplace(fp8_linear_name(p), std::move(l));
  }
  std::int64_t index = 0;
  for (auto& [name, l] : linears_) l.index = index, index += kFp8Operands;
  if (index > 0 && recipe_ == Fp8Recipe::delayed) amax_ = b_.zeros(Shape{index});
}

Fp8Scaling::Linear& Fp8Scaling::find(const std::string& linear) {
  return const_cast<Linear&>(static_cast<const Fp8Scaling&>(*this).find(linear));
}

const Fp8Scaling::Linear& Fp8Scaling::find(const std::string& linear) const {
  auto it = linears_.find(linear);
  if (it == linears_.end()) {
    // A linear the chunk's parameter table did not list as FP8: a model wiring error, not user input.
    std::fprintf(stderr, "meshtrain: '%s' is not an FP8 linear of this chunk\n", linear.c_str());
    std::abort();
  }
  return it->second;
}

Tensor Fp8Scaling::quantize(const std::string& linear, Fp8Operand which, const Tensor& x, Fp8Cast cast,
                            const Fp8Split& split) {
  Linear& l = find(linear);
  // TE keeps a weight's cast over the step's micro-batches: only the first is made. Under ZeRO 3 the
  // weight is gathered again for each use, and each use casts it (TE's linear.py re-quantizes a
  // re-gathered weight for its backward too).
  if (which == Fp8Operand::weight) {
    if (!keep_weight_casts_) cast = Fp8Cast::made;
    else if (l.weight_cast) cast = Fp8Cast::kept;
    l.weight_cast = true;
  }
  const auto k = static_cast<std::size_t>(which);
  const bool current = recipe_ == Fp8Recipe::current;
  // Current scaling: what a real run kept is no kernel and no reduction there.
  if (current && cast == Fp8Cast::kept && !b_.holds_values()) return x;
  Fp8CastOp op{current ? 1.f : l.scaling[k].scale(), format_of(static_cast<int>(k)), cast == Fp8Cast::kept ? 0 : 2,
               current};
  // A backend of shapes only (the sim) costs the cast and keeps x: the FP8 copies' memory is the
  // memory model's (engine/plan/fp8_recipe.h), not a second bf16 tensor.
  Tensor out = b_.holds_values() ? b_.empty(x.shape(), x.dtype()) : x;
  // Delayed scaling folds x's amax into the step's; current scaling measures it first and casts by it.
  Tensor amax = current ? current_amax(x, split) : amax_.slice(l.index + static_cast<std::int64_t>(k), 1);
  b_.fp8_cast(x, op, out, amax);
  return out;
}

Tensor Fp8Scaling::current_amax(const Tensor& x, const Fp8Split& split) {
  // Zeroed as TE zeroes it before its amax kernel (a memset: a kernel's cost on the sim).
  Tensor amax = b_.empty(Shape{1});
  b_.fill(amax, 0.f);
  b_.amax(x, amax);
  for (const Group* g : split.over) {
    const bool by_te = std::find(split.by_te.begin(), split.by_te.end(), g) != split.by_te.end();
    if (g->size() > 1 && (by_te || b_.holds_values())) b_.all_reduce(amax, *g, ReduceOp::max);
  }
  return amax;
}

void Fp8Scaling::begin_step() {
  if (amax_.defined()) b_.fill(amax_, 0.f);
  for (auto& [name, l] : linears_) l.weight_cast = false;
}

Result<std::vector<float>> Fp8Scaling::step_amax() const {
  std::vector<float> out(amax_.defined() ? static_cast<std::size_t>(amax_.numel()) : 0);
  if (amax_.defined()) MT_TRY(b_.read(amax_, out));
  return out;
}

Status Fp8Scaling::end_step(std::span<const float> amax) {
  if (amax.size() != linears_.size() * kFp8Operands)
    return make_error("FP8 amax of {} tensors for a chunk of {} FP8 linears ({} tensors)", amax.size(),
                      linears_.size(), linears_.size() * kFp8Operands);
  std::size_t i = 0;
  for (auto& [name, l] : linears_)
    for (DelayedScaling& s : l.scaling) s.record(amax[i++]);
  begin_step();
  return ok_status();
}

float Fp8Scaling::scale(const std::string& linear, Fp8Operand which) const {
  return find(linear).scaling[static_cast<std::size_t>(which)].scale();
}

std::vector<std::string> Fp8Scaling::linears() const {
  std::vector<std::string> out;
  for (const auto& [name, l] : linears_) out.push_back(name);
  return out;
}

std::size_t Fp8Scaling::state_size() const { return kFp8Operands * (static_cast<std::size_t>(history_) + 1); }

std::vector<float> Fp8Scaling::state(const std::string& linear) const {
  std::vector<float> out;
  for (const DelayedScaling& s : find(linear).scaling) {
    const std::vector<float> one = s.state();
    out.insert(out.end(), one.begin(), one.end());
  }
  return out;
}

Status Fp8Scaling::restore(const std::string& linear, std::span<const float> state) {
  if (state.size() != state_size())
    return make_error("FP8 scaling state of linear '{}' has {} values; this recipe keeps {} (3 tensors, each a "
                      "scale and an amax history of {} steps)",
                      linear, state.size(), state_size(), history_);
  Linear& l = find(linear);
  const std::size_t per = state_size() / kFp8Operands;
  for (std::size_t k = 0; k < l.scaling.size(); ++k)
    MT_TRY(l.scaling[k].restore(state.subspan(k * per, per)).context(fmt::format("linear '{}'", linear)));
  return ok_status();
}

}  // namespace meshtrain
