#include "models/moe_routing.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/json_input.h"

namespace meshtrain {

namespace {

// Shares are relative (normalised in shares()), so any finite scale works;
// the bound keeps their sum finite (eight shares of 1e308 summed to inf and
// routed every token nowhere).
constexpr RealRange kShareRange{0, 1e15};

Result<std::vector<double>> parse_shares(const nlohmann::json& j, const std::string& file) {
  std::vector<double> out;
  for (const auto& v : j) {
    if (!v.is_number())
      return make_error("routing file '{}': shares must be non-negative numbers, got {}", file, json_excerpt(v));
    MT_TRY(check_real(fmt::format("routing file '{}': a share", file), v.get<double>(), kShareRange));
    out.push_back(v.get<double>());
  }
  double sum = 0;
  for (double v : out) sum += v;
  if (out.empty() || !(sum > 0)) return make_error("routing file '{}': a list of shares must not be all zero", file);
  return out;
}

}  // namespace

Result<MoeRouting> MoeRouting::parse(const std::string& spec) {
  MoeRouting r;
  r.spec_ = spec;
  if (spec == "uniform") return r;
  if (spec.rfind("zipf:", 0) == 0) {
    const std::string s = spec.substr(5);
    char* end = nullptr;
    const double exponent = std::strtod(s.c_str(), &end);
    if (s.empty() || end == nullptr || *end != '\0' || !(exponent >= 0) || !std::isfinite(exponent))
      return make_error("--moe-routing '{}': zipf needs a non-negative exponent, e.g. zipf:1.2", spec);
    r.kind_ = Kind::zipf;
    r.exponent_ = exponent;
    return r;
  }
  if (spec.rfind("file:", 0) == 0) {
    const std::string file = spec.substr(5);
    MT_ASSIGN(const nlohmann::json j, load_json_file(file, "routing file"));
    if (!j.is_array() || j.empty())
      return make_error("routing file '{}' must hold a list of shares per expert, or one such list per MoE layer",
                        file);
    r.kind_ = Kind::table;
    if (j.front().is_array()) {
      for (const auto& layer : j) {
        if (!layer.is_array()) return make_error("routing file '{}': every entry must be a list of shares", file);
        MT_ASSIGN(auto shares, parse_shares(layer, file));
        r.table_.push_back(std::move(shares));
      }
    } else {
      MT_ASSIGN(auto shares, parse_shares(j, file));
      r.table_.push_back(std::move(shares));
    }
    return r;
  }
  return make_error("unknown --moe-routing '{}'; use uniform, zipf:S (S >= 0) or file:F (a JSON list of shares)",
                    spec);
}

Status MoeRouting::check(int experts, int moe_layers) const {
  if (experts == 0) {
    if (kind_ == Kind::uniform) return ok_status();
    return make_error("--moe-routing {}: the model has no experts, so there is nothing to route; drop the flag "
                      "(it applies to models with experts, e.g. tiny-moe)", spec_);
  }
  if (kind_ != Kind::table) return ok_status();
  if (table_.size() != 1 && static_cast<int>(table_.size()) != moe_layers)
    return make_error("--moe-routing {}: {} lists of shares, the model has {} MoE layers; give one list or {}", spec_,
                      table_.size(), moe_layers, moe_layers);
  for (const auto& shares : table_)
    if (static_cast<int>(shares.size()) != experts)
      return make_error("--moe-routing {}: a list holds {} shares, the model has {} experts", spec_, shares.size(),
                        experts);
  return ok_status();
}

namespace {

// Top-k routing sends each token to k distinct experts, so one expert gets at
// most 1/k of the assignments (max/mean load at most E/k). Shares above that
// are cut to 1/k and the excess goes to the others in proportion to their
// shares (evenly where they have none), until none exceeds it.
void cap_at_one_kth(std::vector<double>& w, int top_k) {
  const double cap = 1.0 / top_k;
  std::vector<bool> capped(w.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    double excess = 0, free_sum = 0;
    std::size_t free_count = 0;
    for (std::size_t e = 0; e < w.size(); ++e) {
      if (!capped[e] && w[e] > cap) excess += w[e] - cap, w[e] = cap, capped[e] = true, changed = true;
      if (!capped[e]) free_sum += w[e], ++free_count;
    }
    if (!changed || free_count == 0) break;
    for (std::size_t e = 0; e < w.size(); ++e)
      if (!capped[e]) w[e] += free_sum > 0 ? excess * w[e] / free_sum : excess / static_cast<double>(free_count);
  }
}

}  // namespace

std::vector<double> MoeRouting::shares(int moe_layer, int experts, int top_k) const {
  std::vector<double> w(static_cast<std::size_t>(experts), 1.0);
  if (kind_ == Kind::zipf)
    for (int e = 0; e < experts; ++e) w[static_cast<std::size_t>(e)] = std::pow(e + 1.0, -exponent_);
  if (kind_ == Kind::table) w = table_[table_.size() == 1 ? 0 : static_cast<std::size_t>(moe_layer)];
  double sum = 0;
  for (double v : w) sum += v;
  for (double& v : w) v /= sum;
  if (top_k > 1) cap_at_one_kth(w, top_k);
  return w;
}

}  // namespace meshtrain
