// The planner's search space: one table of plan dimensions, and the user's
// pins (--fix) and value lists (--allow) over it.
//
// A dimension is one row of `dimensions()`: its name (the plan field's JSON
// key), the values searched by default given the dimensions enumerated before
// it, and how a value is written into a Plan. The enumeration
// (candidates.h) walks the rows in table order, so a row may look at the
// earlier rows' values (pp's divisors depend on tp; dp is what tp·pp leave).
// Adding a dimension the engine has learnt is adding one row here; nothing
// else in the planner names dimensions (the fast tier models what each
// plan field costs, fast_estimate.h).
//
// Defaults skip values that give the same plan as another value (ZeRO with
// dp 1, sequence parallelism or split experts with tp 1, uneven stages with
// pp 1) and values that cannot divide (pp must divide gpus/(tp·cp));
// everything else is left to validate_plan, the one judge of what the
// engine runs. A row that only means something in some plans (cp_comm with
// cp > 1, gradient compression with data parallelism) says where it
// applies; elsewhere it takes the base plan's value whatever --allow lists,
// so no two candidates differ only in a field the engine ignores.
//
// Which values are searched by default, and why (README "plan"):
//   cp: 1, and powers of two that leave every rank at least
//     kMinContextTokens of the sequence (decoders without experts);
//   cp_comm: allgather and ring where cp > 1;
//   zero_reduce_once: off and on under ZeRO 2/3 with several micro-batches
//     (exact, a trade of gradient memory for fewer reductions);
//   prefetch_across_chunks: on (the base plan's; exact and never later);
//   grad_compression: none; bf16, fp16 and 1bit change the gradients'
//     values, so a plan with them is only searched when --allow lists them;
//   offload: none, optimizer, and params under ZeRO 3; the planner keeps an
//     offload plan only where the same plan without offload does not fit
//     (planner.h), since offload only adds PCIe and host time;
//   overlap_update: on where it applies (no offload; exact, measured never
//     slower in the DES), off under --allow;
//   overlap_p2p_comm: on where it applies (the interleaved schedule with
//     pp > 1; exact, the receives only move off the compute stream), off
//     under --fix or --allow;
//   fp8_param_gather: on where it applies (precision fp8, ZeRO 1-3: less
//     memory and fewer gathered bytes, never slower; Megatron-Bridge's FP8
//     recipes set it), off under --fix or --allow; a plan with it is
//     simulated only (train refuses it). Not for plans of dp 1 (the search
//     gives them ZeRO 0); segment layouts are formed with and without it,
//     or as a pin of it says (segment_candidates.h);
//   recompute_modules: the base plan's (--recompute-modules) on models with
//     experts, unless recompute is full; other sets (they trade time for
//     memory) under --allow recompute_modules=none,moe_act,...;
//   moe_a2a_overlap: off and on where ep > 1, the schedule pairs passes
//     (check_a2a_overlap) and has a steady state to pair (more micro-batches
//     than stages): exact, but it holds up to one layer's activations more
//     and slows the compute it runs beside, so the simulations decide.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/plan/plan.h"
#include "engine/step/step_engine.h"
#include "models/model_spec.h"

namespace meshtrain::planner {

// What every candidate shares: the job, not the plan.
struct SearchContext {
  ModelSpec model;
  int gpus = 1;
  int gpus_per_node = 8;
  // Plan fields that are not searched (global batch, seq_len, precision,
  // gradient buckets): every candidate starts from this plan.
  Plan base;
  // What every candidate runs with (dropout): plans the step engine cannot
  // run with it (dropout under context parallelism) are not candidates.
  StepOptions step;
};

struct Dimension {
  const char* name;  // the plan field's JSON key: "tp", "micro_batch", "recompute"
  const char* help;
  // Derived dimensions (dp) have one value given the earlier ones: --allow
  // and --fix can only narrow them.
  bool derived;
  // Values searched when the user gives none, knowing the earlier rows' values in `partial`.
  std::vector<int> (*defaults)(const SearchContext& ctx, const Plan& partial);
  void (*apply)(Plan& p, int value);
  int (*get)(const Plan& p);
  // Text to value and back ("full" <-> 2, "on" <-> 1); an Error names the valid values.
  Result<int> (*parse)(std::string_view text);
  std::string (*format)(int value);
  // Whether the field means anything given the earlier rows; null: always.
  bool (*applies)(const SearchContext& ctx, const Plan& partial) = nullptr;
};

// Context parallelism is searched by default only while each rank keeps at
// least this many tokens of a sequence: below it the attention that cp
// splits is a small share of a layer, its per-layer key/value exchange is
// latency-bound, and data parallelism splits the same work with one
// reduction per step (Llama 3 trains 128K-token sequences with cp 16, 8K per rank).
inline constexpr int kMinContextTokens = 4096;

// The rows, in enumeration order.
const std::vector<Dimension>& dimensions();
// The row named `name`, or an Error that suggests the nearest name.
Result<const Dimension*> find_dimension(std::string_view name);

// Per dimension (indexed as dimensions()), the values the user allowed:
// unset means the defaults. A --fix is a list of one.
struct SearchSpace {
  std::vector<std::optional<std::vector<int>>> allowed = std::vector<std::optional<std::vector<int>>>(dimensions().size());
  // Values this dimension takes after `partial`'s earlier rows.
  std::vector<int> values(std::size_t dim, const SearchContext& ctx, const Plan& partial) const;
  // "tp=8 pp=4", the pinned dimensions; empty when none.
  std::string describe_fixed() const;
  // The one value a --fix (or a one-value --allow) gives the dimension named `name`; none when unpinned.
  std::optional<int> pinned(std::string_view name) const;
};

// Parses the --fix and --allow lists into a space. Each item is
// `name=v[,v...]`; a comma-separated token without '=' is one more value of
// the name before it, so `--fix tp=8,pp=4` and `--allow tp=1,2,4,16` both
// read naturally. An Error names the item: an unknown dimension (with the
// nearest name), a bad value, a --fix with two values, a dimension fixed
// twice to different values, a --fix outside the same dimension's --allow
// list, and fixed tp·pp·dp that cannot make `ctx.gpus`.
Result<SearchSpace> parse_search_space(const std::vector<std::string>& fix, const std::vector<std::string>& allow,
                                       const SearchContext& ctx);

}  // namespace meshtrain::planner
