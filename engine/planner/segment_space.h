// --fix and --allow over segment layouts (segment_candidates.h).
//
// A segment is named by a module it holds, since which segment index a
// module lands in changes with the cut while the module does not:
//   MODULE.DIM=v       the segment holding MODULE takes v (vision.tp=2,
//                      language.pp=4, stage3.zero=1); DIM is tp, pp, dp,
//                      gpus (tp·pp·dp), zero, recompute or sequence_parallel
//   segments.count=N   layouts of N segments (2 or 3)
//   segments.microbatches=m   the micro-batches every segment cuts the batch into
// Items mix freely with the uniform dimensions' in one flag (`--fix
// tp=8,vision.tp=2`): a name with a dot is a segment item. Two modules pinned
// in one segment must agree; a layout that puts them together otherwise is
// not formed.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "engine/planner/search_space.h"

namespace meshtrain::planner {

// The per-segment dimensions a MODULE.DIM item may name, in the order the help lists them.
const std::vector<std::string>& segment_dimension_names();

struct SegmentSpace {
  // (module or "segments", dimension) -> values (sorted, unique); a --fix is a list of one.
  std::map<std::pair<std::string, std::string>, std::vector<int>> allowed;
  std::map<std::pair<std::string, std::string>, std::string> written;  // the items as given, for messages

  bool empty() const { return allowed.empty(); }
  // "vision.tp=2 language.pp=4": every item as given.
  std::string describe() const;
  // The values a segment holding `modules` may take for `dim`: nullopt when
  // no module of them is pinned, else the intersection of their lists
  // (empty: two pins contradict, the layout is not formed).
  std::optional<std::vector<int>> values(const std::vector<std::string>& modules, const std::string& dim) const;
  // The layout-wide value list ("count", "microbatches"), nullopt when not given.
  std::optional<std::vector<int>> layout_values(const std::string& dim) const;
  // Whether `v` is allowed by values(modules, dim) (true when unpinned).
  bool admits(const std::vector<std::string>& modules, const std::string& dim, int v) const;
};

// --fix and --allow split into the uniform dimensions' items (for
// parse_search_space, same syntax) and the segment space. An Error names the
// item: an unknown module (with the nearest of the model's modules) or
// dimension, a bad value, a --fix of two values, one pinned twice to
// different values or outside its --allow list, pinned degrees whose product
// cannot make `ctx.gpus` or disagrees with the module's pinned gpus, and
// segment items on a model without segment layouts.
struct SplitPins {
  std::vector<std::string> uniform_fix, uniform_allow;
  SegmentSpace segments;
};
Result<SplitPins> split_pins(const std::vector<std::string>& fix, const std::vector<std::string>& allow,
                             const SearchContext& ctx);

}  // namespace meshtrain::planner
