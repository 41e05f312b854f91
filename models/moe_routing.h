// MoeRouting: how a simulated run spreads tokens over experts. The sim
// backend holds no data, so a router cannot choose; the MoE layer asks this
// model instead (models/moe_dispatch.h, modelled_dispatch) and the step then
// waits for the EP rank whose experts receive the most.
//
// Specs (`meshtrain simulate --moe-routing`):
//   uniform   every expert gets 1/E of the assignments: the balance the
//             auxiliary loss aims for.
//   zipf:S    expert e (0-based) gets a share ∝ 1/(e+1)^S, S >= 0: skew as
//             measured on trained routers. The hottest experts are
//             neighbours, so they share an EP rank: the pessimistic placement.
//   file:F    a JSON file: a list of E non-negative numbers (every MoE layer),
//             or a list of such lists, one per MoE layer in model order;
//             shares are the numbers normalised (e.g. measured tokens per
//             expert, as `meshtrain train --metrics` reports them).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace meshtrain {

class MoeRouting {
 public:
  static Result<MoeRouting> parse(const std::string& spec);
  static MoeRouting uniform() { return MoeRouting(); }

  // Checks the routing against the model: a model without experts takes none
  // but uniform (the default); a file's lists hold E entries each, one list or one per MoE layer.
  Status check(int experts, int moe_layers) const;
  // Shares of the assignments per expert (E numbers summing to 1) in MoE layer `moe_layer` (0-based among them).
  // With top-k routing no expert gets more than 1/k of them (a token picks k distinct experts): larger shares
  // are cut to 1/k and the rest spread over the others, so max/mean load stays within E/k.
  std::vector<double> shares(int moe_layer, int experts, int top_k) const;
  const std::string& spec() const { return spec_; }

 private:
  enum class Kind { uniform, zipf, table };
  Kind kind_ = Kind::uniform;
  double exponent_ = 0;
  std::vector<std::vector<double>> table_;
  std::string spec_ = "uniform";
};

}  // namespace meshtrain
