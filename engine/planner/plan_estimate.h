// The fast tier for every candidate the planner forms (planner.h): an
// iteration time for each plan that fits, so that both families, uniform
// plans (candidates.h) and segment layouts (segment_candidates.h), are
// ranked the same way and only their best go to the full simulation. One
// estimator serves both: a reference simulation or collective fit one
// family needed serves the other.
//
// A uniform plan is a plan of one segment; it is timed by fast_estimate.h's
// closed forms, which cover every dimension a uniform plan has (vpp, ep, cp,
// offload, compression, overlap). A plan of several segments is composed
// from the same references and collective fits, as follows.
//
// Per segment s (its own tp, pp, dp, micro-batch, ZeRO, recomputation, sp):
//   block times: the uniform tier's cached DES of the whole model at the
//     segment's key (tp, sp, micro-batch, recomputation). When the model
//     refuses that key as a whole (a tp that divides the segment's heads but
//     not another module's) the tp 1 reference at the same micro-batch is
//     divided by tp and each body block adds its tensor-parallel all-reduces
//     (2 in forward, 2 in backward, 2 more under full recomputation) of its
//     output activation on the tp group; ZeRO 2/3 bound a block's passes by
//     its reduce-scatter and gather as in the uniform tier
//   P_s = m·t_max + (p−1)·(t_mean + 2·t_hop)   its micro-batches through its p stages
//   l_s = Σ stages t + 2·(p−1)·t_hop            one micro-batch through them
//   optimizer, data parallel: the uniform tier's forms over the segment's
//     own replicas and its most loaded stage's parameters
// Composition (engine/step/training_engine.h runs consecutive segments
// on the same ranks one after the other, and a segment on ranks of its own as
// a downstream pipeline stage of the one before):
//   a group = consecutive segments on the same ranks; it runs its segments in
//     turn: T_g = Σ P_s + the all-to-all reshards between them (forward and
//     backward); its latency l_g = T_g − Σ (P_e − l_e) over the segments e
//     that face a disjoint neighbour (they pipeline with it, the others run
//     all their micro-batches first)
//   groups on disjoint ranks pipeline like stages of one pipeline:
//     pipeline = max_g (T_g + Σ_{h≠g} l_h) + 2·t_boundary per disjoint boundary
//     (m·t_max + Σ others' latency: the slowest group paces the rest)
//   group g ends its backward Σ_{h<g} (backward share of l_h + t_boundary)
//     before the upstream group, then runs its optimizer and exposed data
//     parallel time: iteration = max_g (end_g + optimizer_g + data parallel_g)
// Its job is to rank; RESULTS.md reports the order's and the times' agreement with the DES.
#pragma once

#include <set>
#include <vector>

#include "engine/planner/fast_estimate.h"

namespace meshtrain::planner {

class PlanEstimator {
 public:
  // As FastEstimator: `options` is what the full tier simulates with and must outlive the estimator.
  PlanEstimator(const SearchContext& ctx, const SimulateOptions& options);

  // Runs the reference simulations and collective fits the plans need that are not cached yet, on all cores.
  Status prepare(const std::vector<const Plan*>& plans);
  // Needs prepare() for `p`; `fit` is its memory_fit.
  FastBreakdown estimate(const Plan& p, const MemoryFit& fit) const;
  // Reference simulations run so far, for every plan prepared.
  std::size_t reference_simulations() const { return fast_.reference_simulations(); }

 private:
  Status prepare_segments(const std::vector<const Plan*>& plans);
  FastBreakdown compose_segments(const Plan& p) const;
  struct Terms {
    double pipeline = 0, latency = 0, bubble = 0, p2p = 0;
    double optimizer = 0, data_parallel = 0;
    double backward_share = 0;  // of a block's forward and backward
  };
  Terms segment_terms(const Plan& s) const;
  bool whole_model_takes(const FastEstimator::Key& key) const;
  // Seconds of one boundary crossing (one direction) between consecutive segments.
  double boundary_s(const Plan& producer, const Plan& consumer) const;
  double boundary_bytes(const Plan& producer, std::int64_t samples) const;

  const SearchContext& ctx_;
  FastEstimator fast_;
  std::set<FastEstimator::Key> scaled_;  // keys the model refuses whole: from the tp 1 reference
  std::vector<BlockIo> io_;              // per block, at the job's sequence length
};

}  // namespace meshtrain::planner
