#include "engine/planner/segment_candidates.h"

#include <algorithm>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <tbb/parallel_for.h>

#include "engine/plan/mesh.h"
#include "engine/plan/segment_plan.h"
#include "engine/step/step_engine.h"
#include "models/model_io.h"
#include "models/model_tables.h"

namespace meshtrain::planner {

namespace {

struct Module {
  std::string name;
  int first = 0, last = 0;  // block indices, inclusive
};

std::vector<Module> modules_of(const ModelSpec& m) {
  std::vector<Module> out;
  const auto tables = model_tables(m);
  for (int i = 0; i < static_cast<int>(tables->blocks.size()); ++i) {
    const std::string& name = tables->blocks[static_cast<std::size_t>(i)]->module();
    if (out.empty() || out.back().name != name) out.push_back({name, i, i});
    out.back().last = i;
  }
  return out;
}

// A segment's place in a layout: its modules and ranks.
struct Part {
  Module from, to;
  std::vector<std::string> modules;
  int first_rank = 0, ranks = 0;
  bool last = false;
};

struct Degrees {
  int tp = 1, pp = 1, dp = 1;
};

// (tp, pp, dp) over the part's GPUs: tp a power of two up to a node (or the pinned values) dividing them, pp (the
// last segment's, up to one stage per body layer; others only when pinned) dividing what is left, dp the rest.
std::vector<Degrees> degrees_of(const Part& part, const SearchContext& ctx, const SegmentSpace& space, int body) {
  std::vector<int> tps;
  for (int tp = 1; tp <= std::min(part.ranks, ctx.gpus_per_node); tp *= 2) tps.push_back(tp);
  if (const auto pinned = space.values(part.modules, "tp")) tps = *pinned;
  const int max_pp = part.last || space.values(part.modules, "pp") ? std::max(1, body) : 1;
  std::vector<Degrees> out;
  for (int tp : tps) {
    if (part.ranks % tp != 0) continue;
    for (int pp = 1; pp <= std::min(part.ranks / tp, max_pp); ++pp) {
      const Degrees d{tp, pp, part.ranks / tp / pp};
      if ((part.ranks / tp) % pp == 0 && space.admits(part.modules, "pp", pp) && space.admits(part.modules, "dp", d.dp) &&
          space.admits(part.modules, "gpus", part.ranks))
        out.push_back(d);
    }
  }
  return out;
}

nlohmann::json segment_json(const Part& part, const Degrees& d, int microbatches) {
  return {{"name", part.from.name == part.to.name ? part.from.name : part.from.name + ".." + part.to.name},
          {"blocks", {part.from.first, part.to.last}},
          {"ranks", {part.first_rank, part.first_rank + part.ranks - 1}},
          {"tp", d.tp},
          {"pp", d.pp},
          {"dp", d.dp},
          {"microbatches", microbatches}};
}

// A segment's ZeRO stage, recomputation and sequence parallelism.
struct Choice {
  int zero = 0;
  Recompute recompute = Recompute::none;
  bool sp = false;
};

// The choices a segment may take (its degrees known): the pinned values, else the defaults.
std::vector<Choice> choices_of(const Plan& s, const std::vector<std::string>& modules, const SegmentSpace& space) {
  const std::vector<int> zeros = space.values(modules, "zero").value_or(s.dp > 1 ? std::vector<int>{0, 1, 2, 3}
                                                                                  : std::vector<int>{0});
  const std::vector<int> recomputes = space.values(modules, "recompute")
                                          .value_or(std::vector<int>{static_cast<int>(Recompute::none),
                                                                     static_cast<int>(Recompute::full)});
  const std::vector<int> sps =
      space.values(modules, "sequence_parallel").value_or(s.tp > 1 ? std::vector<int>{0, 1} : std::vector<int>{0});
  std::vector<Choice> out;
  for (int zero : zeros)
    for (int rc : recomputes)
      for (int sp : sps) out.push_back({zero, static_cast<Recompute>(rc), sp != 0});
  return out;
}

// The cuts of `modules` into `count` contiguous parts: the first module index of each part after the first.
std::vector<std::vector<std::size_t>> cuts_of(std::size_t modules, int count) {
  std::vector<std::vector<std::size_t>> out;
  for (std::size_t a = 1; a < modules; ++a) {
    if (count == 2) out.push_back({a});
    else
      for (std::size_t b = a + 1; b < modules; ++b) out.push_back({a, b});
  }
  return out;
}

// One layout of the family, valid: per segment its valid choices and, per
// choice, the bytes each of its pipeline stages' ranks holds.
struct LayoutChoices {
  Plan base;  // with its segments
  std::vector<std::vector<Choice>> choices;
  std::vector<std::vector<std::vector<double>>> bytes;  // [segment][choice][stage]
  std::vector<Mesh> meshes;

  std::size_t segments() const { return choices.size(); }
  bool holds(std::size_t k, int rank) const { return base.segments[k].holds_rank(rank); }
  std::size_t stage_of(std::size_t k, int rank) const {
    return static_cast<std::size_t>(meshes[k].coord_of(rank).pp);
  }

  // A combination of choices (an index per segment): its peak bytes and the
  // rank that holds them (each rank sums its segments' stages).
  std::pair<double, int> peak(const std::vector<std::size_t>& at, int gpus) const {
    std::pair<double, int> worst{0, 0};
    for (int rank = 0; rank < gpus; ++rank) {
      double total = 0;
      for (std::size_t k = 0; k < segments(); ++k)
        if (holds(k, rank)) total += bytes[k][at[k]][stage_of(k, rank)];
      worst = std::max(worst, std::pair{total, rank});
    }
    return worst;
  }

  std::optional<std::size_t> find(std::size_t k, const Choice& c) const {
    for (std::size_t i = 0; i < choices[k].size(); ++i)
      if (choices[k][i].zero == c.zero && choices[k][i].recompute == c.recompute && choices[k][i].sp == c.sp) return i;
    return std::nullopt;
  }

  // Memory savings one step up a segment's ladder: ZeRO 2, ZeRO 3, then full
  // recomputation (skipping what the segment cannot take or the pins leave out).
  std::optional<std::size_t> step_up(std::size_t k, std::size_t j) const {
    Choice c = choices[k][j];
    const bool zero_room = base.segments[k].dp > 1;
    while (true) {
      if (zero_room && c.zero < 3 && c.recompute == Recompute::none) c.zero = std::max(2, c.zero + 1);
      else if (c.recompute != Recompute::full) c.recompute = Recompute::full;
      else return std::nullopt;
      if (const auto i = find(k, c)) return i;
    }
  }

  // Where a segment's choices start: those no step up reaches (ZeRO 0/1 without recomputation, with and without sp).
  std::vector<std::vector<std::size_t>> roots() const {
    std::vector<std::vector<std::size_t>> out(segments());
    for (std::size_t k = 0; k < segments(); ++k) {
      std::vector<bool> reached(choices[k].size(), false);
      for (std::size_t j = 0; j < choices[k].size(); ++j)
        if (const auto up = step_up(k, j)) reached[*up] = true;
      for (std::size_t j = 0; j < choices[k].size(); ++j)
        if (!reached[j]) out[k].push_back(j);
    }
    return out;
  }

  // Raises `pick` one step at a time on its most loaded rank (the segment
  // there whose step saves the most) until it fits `device` bytes or no step
  // is left; returns its peak bytes.
  double raise_until_fits(std::vector<std::size_t>& pick, double device, int gpus) const {
    auto [need, rank] = peak(pick, gpus);
    while (need > device) {
      std::optional<std::size_t> best_k, best_j;
      double best_saving = 0;
      for (std::size_t k = 0; k < segments(); ++k) {
        if (!holds(k, rank)) continue;
        const auto up = step_up(k, pick[k]);
        if (!up) continue;
        const double saving = bytes[k][pick[k]][stage_of(k, rank)] - bytes[k][*up][stage_of(k, rank)];
        if (saving > best_saving) best_saving = saving, best_k = k, best_j = up;
      }
      if (!best_k) break;
      pick[*best_k] = *best_j;
      std::tie(need, rank) = peak(pick, gpus);
    }
    return need;
  }

  // The plan of `pick`, and its plan file's segments (`list` with the choices written in).
  SegmentCandidate candidate(const std::vector<std::size_t>& pick, const nlohmann::json& list) const {
    Plan p = base;
    nlohmann::json segs = list;
    for (std::size_t k = 0; k < segments(); ++k) {
      const Choice& c = choices[k][pick[k]];
      Plan& s = p.segments[k];
      s.zero = c.zero, s.recompute = c.recompute, s.sequence_parallel = c.sp;
      if (c.zero != 0) segs[k]["zero"] = c.zero;
      if (c.recompute != Recompute::none) segs[k]["recompute"] = recompute_name(c.recompute);
      if (c.sp) segs[k]["sequence_parallel"] = true;
    }
    return {std::move(p), std::move(segs)};
  }
};

// The layout `list` parsed and validated, with each segment's choices that
// validate. nullopt where the layout is invalid (counted in `formed`) or a
// segment has no valid choice; `rejection` keeps the last reason.
std::optional<LayoutChoices> layout_choices(const SearchContext& ctx, const SegmentSpace& space,
                                            const nlohmann::json& list,
                                            const std::vector<std::vector<std::string>>& modules, bool fp8_params,
                                            std::int64_t& formed, Status& rejection) {
  const ModelSpec& m = ctx.model;
  LayoutChoices out;
  out.base = ctx.base;
  if (fp8_params) {
    // FP8 parameters are the whole plan's and need the distributed optimizer in every segment: the
    // segments start at ZeRO 1, and a segment's ZeRO 0 choices (all a dp 1 segment has) do not validate.
    out.base.fp8_param_gather = true;
    out.base.zero = std::max(out.base.zero, 1);
  }
  auto parsed = segments_from_json(list, m, out.base);
  if (!parsed) {
    formed += 1, rejection = parsed.error();
    return std::nullopt;
  }
  out.base.segments = std::move(parsed).value();
  if (Status v = validate_plan(out.base, m, ctx.gpus); !v) {
    formed += 1, rejection = v;
    return std::nullopt;
  }
  const std::size_t n = out.base.segments.size();
  out.choices.resize(n), out.bytes.resize(n);
  for (std::size_t k = 0; k < n; ++k) {
    for (const Choice& c : choices_of(out.base.segments[k], modules[k], space)) {
      Plan s = out.base.segments[k];
      s.zero = c.zero, s.recompute = c.recompute, s.sequence_parallel = c.sp;
      Status v = validate_plan(s, m);
      if (v) v = StepEngine::supports(s, ctx.step);
      if (!v) {
        rejection = v;
        continue;
      }
      std::vector<double> per_stage;
      for (int stage = 0; stage < s.pp; ++stage)
        per_stage.push_back(memory_per_rank(m, s, stage, meshtrain_layout(s)).total());
      out.choices[k].push_back(c);
      out.bytes[k].push_back(std::move(per_stage));
    }
    if (out.choices[k].empty()) return std::nullopt;
  }
  for (const Plan& s : out.base.segments) out.meshes.emplace_back(s);
  return out;
}

// A layout of the family to validate and expand: its segments (degrees,
// micro-batches) and each segment's modules.
struct Layout {
  nlohmann::json list;
  std::vector<std::vector<std::string>> modules;
};

// What one layout expanded into: the candidates that fit, the combinations
// formed and pruned, the last rejection, the one closest to fitting.
struct Expanded {
  std::vector<SegmentCandidate> kept;
  std::int64_t formed = 0, pruned = 0;
  Status rejection = ok_status();
  std::optional<SegmentCandidate> closest;
  double closest_bytes = 0;
};

// Validates one layout of the family and expands it into its per-segment
// choices that fit: each combination of roots, raised until it fits, is kept
// once; of those that cannot fit, the one closest to fitting is remembered.
// `fp8_params`: the whole plan keeps FP8 parameters (Plan::fp8_param_gather).
Expanded expand(const SearchContext& ctx, const SegmentSpace& space, double device, const Layout& l, bool fp8_params) {
  Expanded x;
  const std::optional<LayoutChoices> layout =
      layout_choices(ctx, space, l.list, l.modules, fp8_params, x.formed, x.rejection);
  if (!layout) return x;
  const std::size_t n = layout->segments();
  const std::vector<std::vector<std::size_t>> roots = layout->roots();
  std::set<std::vector<std::size_t>> kept;
  std::vector<std::size_t> root(n, 0);
  while (true) {
    x.formed += 1;
    std::vector<std::size_t> pick(n);
    for (std::size_t k = 0; k < n; ++k) pick[k] = roots[k][root[k]];
    const double need = layout->raise_until_fits(pick, device, ctx.gpus);
    if (need <= device) {
      if (kept.insert(pick).second) x.kept.push_back(layout->candidate(pick, l.list));
    } else {
      x.pruned += 1;
      if (!x.closest || need < x.closest_bytes) x.closest = layout->candidate(pick, l.list), x.closest_bytes = need;
    }
    std::size_t k = 0;
    while (k < n && ++root[k] == roots[k].size()) root[k++] = 0;
    if (k == n) break;
  }
  return x;
}

// The parts of `modules` cut at `cut` (the first module of each part after the first).
std::vector<Part> parts_of(const std::vector<Module>& modules, const std::vector<std::size_t>& cut) {
  std::vector<Part> parts;
  for (std::size_t k = 0; k <= cut.size(); ++k) {
    const std::size_t from = k == 0 ? 0 : cut[k - 1], to = k == cut.size() ? modules.size() - 1 : cut[k] - 1;
    Part part{modules[from], modules[to], {}, 0, 0, k == cut.size()};
    for (std::size_t i = from; i <= to; ++i) part.modules.push_back(modules[i].name);
    parts.push_back(std::move(part));
  }
  return parts;
}

// Every combination of the parts' degrees (`options`, one list per part) with
// every micro-batch count that the global batch divides into, as layouts;
// on the same ranks (`same_ranks`), not the one that is a uniform plan (no
// pipeline and one tp everywhere).
void add_layouts(const std::vector<Part>& parts, const std::vector<std::vector<Degrees>>& options, bool same_ranks,
                 const std::vector<int>& micros, int global, std::vector<Layout>& layouts) {
  for (const auto& o : options)
    if (o.empty()) return;
  std::vector<std::size_t> pick(parts.size(), 0);
  while (true) {
    bool uniform = same_ranks;
    for (std::size_t k = 0; k < parts.size(); ++k)
      uniform = uniform && options[k][pick[k]].pp == 1 && options[k][pick[k]].tp == options[0][pick[0]].tp;
    for (int micro : micros) {
      bool divides = !uniform;
      for (std::size_t k = 0; k < parts.size() && divides; ++k) divides = global % (options[k][pick[k]].dp * micro) == 0;
      if (!divides) continue;
      Layout l;
      l.list = nlohmann::json::array();
      for (std::size_t k = 0; k < parts.size(); ++k) {
        l.list.push_back(segment_json(parts[k], options[k][pick[k]], micro));
        l.modules.push_back(parts[k].modules);
      }
      layouts.push_back(std::move(l));
    }
    std::size_t k = 0;
    while (k < parts.size() && ++pick[k] == options[k].size()) pick[k++] = 0;
    if (k == parts.size()) return;
  }
}

// The family's layouts: cuts into 2 (or 3) segments, all on the same ranks
// or with one pipeline boundary at a half or a quarter of the GPUs, each
// part's degrees, and the micro-batch counts (the pins of `space` first).
std::vector<Layout> layouts_of(const SearchContext& ctx, const SegmentSpace& space, const std::vector<Module>& modules) {
  const int n = ctx.gpus, global = ctx.base.effective_global_batch();
  std::vector<int> counts = {2};
  if (modules.size() == 3) counts.push_back(3);
  if (const auto pinned = space.layout_values("count")) counts = *pinned;
  std::vector<int> micros = {1, 2, 4, 8, 16};
  if (const auto pinned = space.layout_values("microbatches")) micros = *pinned;
  // Where the pipeline boundary puts the first group's last rank: 0 for none.
  std::vector<int> splits = {0};
  if (n % 2 == 0) splits.push_back(n / 2);
  if (n % 4 == 0 && n >= 4) splits.push_back(n / 4), splits.push_back(3 * n / 4);
  std::vector<Layout> layouts;
  for (int count : counts) {
    if (static_cast<std::size_t>(count) > modules.size()) continue;
    for (const std::vector<std::size_t>& cut : cuts_of(modules.size(), count)) {
      std::vector<Part> parts = parts_of(modules, cut);
      // The boundary after part `at` (none when split is 0) gets ranks [0, split) before it, [split, n) after.
      for (std::size_t at = 0; at < cut.size(); ++at)
        for (int split : splits) {
          if (split == 0 && at > 0) continue;  // one all-same-ranks arrangement
          for (std::size_t k = 0; k < parts.size(); ++k) {
            const bool before = k <= at;
            parts[k].first_rank = split == 0 || before ? 0 : split;
            parts[k].ranks = split == 0 ? n : before ? split : n - split;
          }
          std::vector<std::vector<Degrees>> options;
          for (const Part& part : parts) {
            const int body = std::min(part.to.last, modules.back().last - 1) - std::max(part.from.first, 1) + 1;
            options.push_back(degrees_of(part, ctx, space, body));
          }
          add_layouts(parts, options, split == 0, micros, global, layouts);
        }
    }
  }
  return layouts;
}

}  // namespace

bool has_segment_layouts(const ModelSpec& m) {
  const ModelIo io = model_io(m);
  return io.image_side > 0 && !io.routes_to_experts && !m.tied_embeddings && modules_of(m).size() >= 2;
}

SegmentEnumeration enumerate_segment_candidates(const SearchContext& ctx, const SegmentSpace& space,
                                                double device_bytes, std::optional<bool> fp8_params) {
  SegmentEnumeration e;
  const ModelSpec& m = ctx.model;
  if (ctx.gpus < 2 || !has_segment_layouts(m)) return e;
  const std::vector<Layout> layouts = layouts_of(ctx, space, modules_of(m));
  // Under fp8 every layout is expanded without and with FP8 parameters, as the uniform search tries
  // fp8_param_gather where it applies (search_space.cc), unless pinned; the base plan's setting otherwise.
  std::vector<bool> fp8_settings{ctx.base.fp8_param_gather};
  if (ctx.base.precision == Precision::fp8) {
    if (fp8_params) fp8_settings = {*fp8_params};
    else if (!ctx.base.fp8_param_gather) fp8_settings.push_back(true);
  }
  const std::size_t runs = layouts.size() * fp8_settings.size();
  std::vector<Expanded> expanded(runs);
  tbb::parallel_for(std::size_t{0}, runs, [&](std::size_t r) {
    expanded[r] = expand(ctx, space, device_bytes, layouts[r % layouts.size()], fp8_settings[r / layouts.size()]);
  });
  for (std::size_t r = 0; r < runs; ++r) {
    Expanded& x = expanded[r];
    e.combinations += x.formed;
    e.pruned += x.pruned;
    if (!x.rejection && !e.example_rejection)
      e.example_rejection = fmt::format("{}: {}", layouts[r % layouts.size()].list.dump(), x.rejection.error().message());
    if (x.closest && (!e.closest || x.closest_bytes < e.closest_bytes))
      e.closest = std::move(x.closest), e.closest_bytes = x.closest_bytes;
    for (SegmentCandidate& c : x.kept) e.valid.push_back(std::move(c));
  }
  return e;
}

std::string describe_segments_short(const Plan& p) {
  std::string out;
  for (std::size_t k = 0; k < p.segments.size(); ++k) {
    const Plan& s = p.segments[k];
    out += fmt::format("{}{} tp {}{} dp {}", k == 0 ? "" : " | ", s.segment_name, s.tp,
                       s.pp > 1 ? fmt::format(" pp {}", s.pp) : std::string(), s.dp);
    if (k > 0 && s.first_rank != p.segments[k - 1].first_rank) out += fmt::format(" @{}", s.first_rank);
    if (s.zero > 0) out += fmt::format(" z{}", s.zero);
    if (s.recompute != Recompute::none) out += s.recompute == Recompute::full ? " rc" : " rcs";
    if (s.sequence_parallel) out += " sp";
  }
  out += fmt::format(" m {}", p.segments.back().microbatches());
  if (p.fp8_param_gather) out += " fp8-params";
  return out;
}

}  // namespace meshtrain::planner
