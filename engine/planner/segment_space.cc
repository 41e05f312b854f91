#include "engine/planner/segment_space.h"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/names.h"
#include "engine/planner/segment_candidates.h"
#include "models/model_tables.h"

namespace meshtrain::planner {

namespace {

constexpr const char* kLayout = "segments";  // the prefix of the layout-wide items
const std::vector<std::string> kLayoutDimensions = {"count", "microbatches"};

struct Item {
  std::string owner, dim;  // module (or "segments") and dimension
  std::vector<int> values;
  std::string text;
};

Result<int> positive(std::string_view text) {
  int v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < 1)
    return make_error("'{}' is not a positive integer", text);
  return v;
}

// The value of a segment item as its uniform namesake reads it ("full", "on"), or a count.
Result<int> parse_value(const std::string& dim, std::string_view text) {
  if (dim == "gpus" || dim == "count" || dim == "microbatches") return positive(text);
  MT_ASSIGN(const Dimension* d, find_dimension(dim));
  return d->parse(text);
}

// Splits one flag's comma list into items (a token without '=' is one more value of the item before it);
// segment items go to `items`, the uniform ones back into `uniform` as "name=v[,v...]".
Status split_spec(const std::string& flag, const std::string& spec, const std::vector<std::string>& modules,
                  std::vector<Item>& items, std::vector<std::string>& uniform) {
  std::size_t start = 0;
  bool segment_item = false, uniform_item = false;
  while (start <= spec.size()) {
    const std::size_t comma = std::min(spec.find(',', start), spec.size());
    const std::string token = spec.substr(start, comma - start);
    start = comma + 1;
    const std::size_t eq = token.find('=');
    const std::size_t dot = token.find('.');
    if (eq != std::string::npos) segment_item = dot != std::string::npos && dot < eq;
    if (!segment_item) {
      // Each uniform item its own string, left to parse_search_space, which names what is wrong with it.
      if (eq != std::string::npos || !uniform_item) uniform.push_back(token);
      else uniform.back() += "," + token;
      uniform_item = true;
      continue;
    }
    std::string value = token;
    if (eq != std::string::npos) {
      Item item{token.substr(0, dot), token.substr(dot + 1, eq - dot - 1), {}, token};
      const bool layout = item.owner == kLayout;
      const std::vector<std::string>& dims = layout ? kLayoutDimensions : segment_dimension_names();
      if (std::find(dims.begin(), dims.end(), item.dim) == dims.end())
        return make_error("{} '{}': {}", flag, spec,
                          unknown_name_message(layout ? "layout dimension" : "segment dimension", item.dim, dims));
      // (A model without segment layouts is refused as such by split_pins.)
      if (!layout && !modules.empty() && std::find(modules.begin(), modules.end(), item.owner) == modules.end()) {
        std::vector<std::string> valid = modules;
        valid.push_back(kLayout);
        return make_error("{} '{}': {}", flag, spec, unknown_name_message("module", item.owner, valid));
      }
      items.push_back(std::move(item));
      value = token.substr(eq + 1);
    } else {
      items.back().text += "," + token;
    }
    auto v = parse_value(items.back().dim, value);
    if (!v) return make_error("{} '{}': {} value '{}': {}", flag, spec, items.back().text, value, v.error().message());
    items.back().values.push_back(*v);
  }
  return ok_status();
}

}  // namespace

const std::vector<std::string>& segment_dimension_names() {
  static const std::vector<std::string> names = {"tp", "pp", "dp", "gpus", "zero", "recompute", "sequence_parallel"};
  return names;
}

std::string SegmentSpace::describe() const {
  std::vector<std::string> out;
  for (const auto& [key, text] : written) out.push_back(text);
  return fmt::format("{}", fmt::join(out, " "));
}

std::optional<std::vector<int>> SegmentSpace::values(const std::vector<std::string>& modules,
                                                     const std::string& dim) const {
  std::optional<std::vector<int>> out;
  for (const std::string& module : modules) {
    const auto it = allowed.find({module, dim});
    if (it == allowed.end()) continue;
    if (!out) {
      out = it->second;
      continue;
    }
    std::vector<int> both;
    std::set_intersection(out->begin(), out->end(), it->second.begin(), it->second.end(), std::back_inserter(both));
    out = std::move(both);
  }
  return out;
}

std::optional<std::vector<int>> SegmentSpace::layout_values(const std::string& dim) const {
  const auto it = allowed.find({kLayout, dim});
  return it == allowed.end() ? std::nullopt : std::optional(it->second);
}

bool SegmentSpace::admits(const std::vector<std::string>& modules, const std::string& dim, int v) const {
  const auto list = values(modules, dim);
  return !list || std::find(list->begin(), list->end(), v) != list->end();
}

Result<SplitPins> split_pins(const std::vector<std::string>& fix, const std::vector<std::string>& allow,
                             const SearchContext& ctx) {
  std::vector<std::string> modules;
  if (has_segment_layouts(ctx.model))
    for (const auto& b : model_tables(ctx.model)->blocks)
      if (modules.empty() || modules.back() != b->module()) modules.push_back(b->module());
  SplitPins out;
  std::vector<Item> allowed, fixed;
  for (const std::string& spec : allow) MT_TRY(split_spec("--allow", spec, modules, allowed, out.uniform_allow));
  for (const std::string& spec : fix) MT_TRY(split_spec("--fix", spec, modules, fixed, out.uniform_fix));
  if ((!allowed.empty() || !fixed.empty()) && !has_segment_layouts(ctx.model))
    return make_error("'{}' names a segment, but model '{}' has no segment layouts (an image model of several "
                      "modules, untied, not MoE, has them); drop the MODULE.DIM items",
                      (fixed.empty() ? allowed : fixed).front().text, ctx.model.name);
  SegmentSpace& s = out.segments;
  for (Item& item : allowed) {
    std::sort(item.values.begin(), item.values.end());
    item.values.erase(std::unique(item.values.begin(), item.values.end()), item.values.end());
    s.allowed[{item.owner, item.dim}] = item.values;
    s.written[{item.owner, item.dim}] = item.text;
  }
  std::map<std::pair<std::string, std::string>, std::string> fixed_by;
  for (const Item& item : fixed) {
    const std::pair key{item.owner, item.dim};
    if (item.values.size() != 1)
      return make_error("--fix {}: a --fix pins one value; to search several use --allow {}", item.text, item.text);
    const int v = item.values.front();
    if (fixed_by.count(key)) {
      if (s.allowed[key].front() != v)
        return make_error("--fix {} and --fix {} contradict: {}.{} can only take one value", fixed_by[key], item.text,
                          item.owner, item.dim);
      continue;
    }
    if (s.allowed.count(key) && std::find(s.allowed[key].begin(), s.allowed[key].end(), v) == s.allowed[key].end())
      return make_error("--fix {} is outside --allow's list for {}.{} ({}); drop one of them", item.text, item.owner,
                        item.dim, fmt::join(s.allowed[key], ","));
    s.allowed[key] = {v};
    s.written[key] = item.text;
    fixed_by[key] = item.text;
  }
  // Degrees that multiply into a module's GPUs, caught here with their names.
  for (const std::string& module : modules) {
    std::int64_t product = 1;
    std::string named;
    for (const char* dim : {"tp", "pp", "dp"}) {
      const auto it = fixed_by.find({module, dim});
      if (it == fixed_by.end()) continue;
      product *= s.allowed[{module, dim}].front();
      named += fmt::format("{}{}", named.empty() ? "" : " and ", it->second);
      if (product > ctx.gpus || ctx.gpus % product != 0)
        return make_error("--fix {} needs a multiple of {} GPUs for the segment holding '{}', but --gpus is {}; "
                          "change the fixed degrees or --gpus",
                          named, product, module, ctx.gpus);
    }
    const auto gpus = fixed_by.find({module, "gpus"});
    if (gpus == fixed_by.end()) continue;
    const int g = s.allowed[{module, "gpus"}].front();
    if (g > ctx.gpus)
      return make_error("--fix {}: the segment holding '{}' cannot have more GPUs than --gpus {}", gpus->second, module,
                        ctx.gpus);
    const bool all = fixed_by.count({module, "tp"}) && fixed_by.count({module, "pp"}) && fixed_by.count({module, "dp"});
    if ((all && product != g) || g % product != 0)
      return make_error("--fix {} and --fix {} contradict: tp·pp·dp = {} {} the segment's {} GPUs", named,
                        gpus->second, product, all ? "is not" : "does not divide", g);
  }
  if (const auto count = s.layout_values("count"))
    for (int c : *count)
      if (c < 2 || c > 3)
        return make_error("segments.count={}: segment layouts have 2 or 3 segments (one segment is a uniform plan: "
                          "--layouts uniform)",
                          c);
  return out;
}

}  // namespace meshtrain::planner
