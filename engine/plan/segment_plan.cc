#include "engine/plan/segment_plan.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/json_input.h"
#include "core/names.h"
#include "engine/plan/mesh.h"
#include "models/block.h"
#include "models/model_io.h"

namespace meshtrain {

namespace {

// "key": [first, last], both integers in `range` (through core's bounded
// reader: 2^32 + 1 must not wrap to 1).
Result<std::pair<int, int>> inclusive_pair(const nlohmann::json& seg, const char* key, std::string_view what,
                                           const std::string& label, const IntRange& range) {
  const auto& v = seg[key];
  if (!v.is_array() || v.size() != 2)
    return make_error("{}: \"{}\" must be [first, last] ({}, inclusive), got {}", label, key, what,
                      json_excerpt(v));
  MT_ASSIGN(const std::int64_t first, json_int(v[0], fmt::format("{}: \"{}\" first", label, key), range));
  MT_ASSIGN(const std::int64_t last, json_int(v[1], fmt::format("{}: \"{}\" last", label, key), range));
  return std::pair{static_cast<int>(first), static_cast<int>(last)};
}

Result<BlockRange> blocks_of(const nlohmann::json& seg, const ModelBlocks& blocks, const std::string& label) {
  const int n = static_cast<int>(blocks.size());
  if (seg.contains("blocks")) {
    MT_ASSIGN(const auto b, inclusive_pair(seg, "blocks", "block indices", label, {0, n - 1}));
    const auto [first, last] = b;
    if (first > last)
      return make_error("{}: blocks [{}, {}] are not a range within the model's {} blocks (0..{})", label, first,
                        last, n, n - 1);
    return BlockRange{first, last};
  }
  std::vector<std::string> names;
  if (seg.contains("module")) {
    if (!seg["module"].is_string()) return make_error("{}: \"module\" must be a module name", label);
    names.push_back(seg["module"].get<std::string>());
  } else if (seg.contains("modules")) {
    if (!seg["modules"].is_array()) return make_error("{}: \"modules\" must be a list of module names", label);
    for (const auto& v : seg["modules"]) {
      if (!v.is_string()) return make_error("{}: \"modules\" must be a list of module names, got {}", label, v.dump());
      names.push_back(v.get<std::string>());
    }
  } else {
    return make_error("{}: give its blocks as \"modules\": [...] or \"blocks\": [first, last]", label);
  }
  if (names.empty())
    return make_error("{}: \"modules\" is empty, so the segment holds no blocks; list the modules it runs (e.g. "
                      "[\"vision\"]) or remove the segment", label);
  std::vector<std::string> known;
  for (const auto& b : blocks)
    if (known.empty() || known.back() != b->module()) known.push_back(b->module());
  BlockRange r{n, -1};
  for (const std::string& name : names) {
    bool found = false;
    for (int i = 0; i < n; ++i)
      if (blocks[static_cast<std::size_t>(i)]->module() == name) {
        r.first = std::min(r.first, i), r.last = std::max(r.last, i), found = true;
      }
    if (!found) return Error(unknown_name_message(label + ": module", name, known));
  }
  for (int i = r.first; i <= r.last; ++i)
    if (std::find(names.begin(), names.end(), blocks[static_cast<std::size_t>(i)]->module()) == names.end())
      return make_error("{}: modules {} are not contiguous (block {} of module '{}' lies between them)", label,
                        fmt::join(names, ", "), i, blocks[static_cast<std::size_t>(i)]->module());
  return r;
}

}  // namespace

BlockRange block_range(const Plan& s, const ModelSpec& m) {
  const int body_end = s.first_layer + (s.layers < 0 ? m.layers - s.first_layer : s.layers);
  return {s.embedding ? 0 : s.first_layer + 1, s.head ? m.layers + 1 : body_end};
}

// What rank `rank` holds of every segment it is in (activations included:
// a segment's forward activations wait for its backward at the iteration's end).
MemoryBreakdown rank_memory(const ModelSpec& m, const Plan& p, int rank) {
  MemoryBreakdown total;
  for (const Plan& s : plan_segments(p)) {
    if (!s.holds_rank(rank)) continue;
    total += memory_per_rank(m, s, Mesh(s).coord_of(rank).pp, meshtrain_layout(s));
  }
  return total;
}

std::vector<Plan> plan_segments(const Plan& p) { return p.segments.empty() ? std::vector<Plan>{p} : p.segments; }

Group plan_world(const Plan& p) {
  Group g;
  g.id = static_cast<int>(plan_segments(p).size()) * kGroupIdsPerSegment;
  for (int r = 0; r < p.world_size(); ++r) g.ranks.push_back(r);
  return g;
}

std::string position_holders(const Plan& p, int rank) {
  if (!p.segments.empty()) return "and every rank holding the same segment stages";
  return fmt::format("pipeline stage {}, and every tp rank and dp replica of that stage", Mesh(p).coord_of(rank).pp);
}

std::vector<int> pipeline_positions(const Plan& p) {
  const std::vector<Plan> segments = plan_segments(p);
  const std::vector<Mesh> meshes(segments.begin(), segments.end());
  std::map<std::vector<int>, int> seen;
  std::vector<int> out;
  for (int r = 0; r < p.world_size(); ++r) {
    std::vector<int> stages;
    for (std::size_t k = 0; k < segments.size(); ++k)
      stages.push_back(segments[k].holds_rank(r) ? meshes[k].coord_of(r).pp : -1);
    out.push_back(seen.emplace(std::move(stages), static_cast<int>(seen.size())).first->second);
  }
  return out;
}

Result<std::vector<Plan>> segments_from_json(const nlohmann::json& list, const ModelSpec& m, const Plan& base) {
  if (!list.is_array() || list.empty())
    return make_error("\"segments\" must be a non-empty list of segment objects");
  const ModelBlocks blocks = model_blocks(m);
  const int global = base.effective_global_batch();
  std::vector<Plan> out;
  for (std::size_t k = 0; k < list.size(); ++k) {
    const nlohmann::json& seg = list[k];
    std::string label = fmt::format("segment {}", k);
    if (!seg.is_object()) return make_error("{} must be a JSON object, got {}", label, seg.dump());
    if (seg.contains("name")) {
      if (!seg["name"].is_string()) return make_error("{}: \"name\" must be a string", label);
      label += fmt::format(" ('{}')", seg["name"].get<std::string>());
    }
    MT_ASSIGN(BlockRange range, blocks_of(seg, blocks, label));
    // The layout fields are a plan's (engine/plan/plan.h); the rest is the segment's own.
    nlohmann::json layout = seg;
    for (const char* own : {"name", "module", "modules", "blocks", "ranks", "microbatches"}) layout.erase(own);
    // The gradients' dtype and the FP8 recipe go with the precision: the whole plan's, so that training
    // can refuse them once.
    for (const char* whole :
         {"global_batch", "micro_batch", "seq_len", "precision", "grad_dtype", "fp8_recipe", "fp8_param_gather", "cp", "ep"})
      if (layout.contains(whole))
        return make_error("{}: '{}' is the whole plan's; give it outside \"segments\"", label, whole);
    auto overrides = plan_overrides_from_json(layout);
    if (!overrides) return std::move(overrides.context(label)).error();
    Plan s = base;
    s.segments.clear();
    s.tp = s.pp = s.dp = s.vpp = 1;
    s.first_stage_layers = s.last_stage_layers = 0;
    MT_ASSIGN(s, apply_overrides(s, *overrides));
    s.segment_name = seg.contains("name") ? seg["name"].get<std::string>() : fmt::format("segment {}", k);
    s.global_batch = global;
    // In 64 bits: dp and micro-batches are each up to 2^20 and 2^30 (an int product wrapped to 0 and divided).
    std::int64_t microbatches = 0;
    if (seg.contains("microbatches")) {
      MT_ASSIGN(microbatches, json_int(seg["microbatches"], label + ": \"microbatches\"", {1, kMaxGlobalBatch}));
    } else {
      const std::int64_t per_step = std::int64_t{s.dp} * base.micro_batch;
      microbatches = global % per_step == 0 ? global / per_step : 1;
    }
    if (global % (std::int64_t{s.dp} * microbatches) != 0)
      return make_error("{}: the global batch {} does not split into dp {} × {} micro-batches; choose dp and "
                        "microbatches whose product divides {}",
                        label, global, s.dp, microbatches, global);
    s.micro_batch = static_cast<int>(global / (s.dp * microbatches));
    s.embedding = range.first == 0;
    s.head = range.last == m.layers + 1;
    s.first_layer = std::max(range.first, 1) - 1;
    s.layers = std::min(range.last, m.layers) - std::max(range.first, 1) + 1;
    s.group_id_base = static_cast<int>(k) * kGroupIdsPerSegment;
    if (seg.contains("ranks")) {
      MT_ASSIGN(const auto r, inclusive_pair(seg, "ranks", "ranks", label, {0, kMaxWorldSize - 1}));
      const auto [first, last] = r;
      if (last < first)
        return make_error("{}: ranks [{}, {}] are not a range of ranks", label, first, last);
      const std::int64_t ranks = std::int64_t{s.tp} * s.pp * s.dp;  // each degree up to 2^20
      if (last - first + 1 != ranks)
        return make_error("{}: ranks [{}, {}] are {} ranks, but tp·pp·dp = {}·{}·{} = {}", label, first, last,
                          last - first + 1, s.tp, s.pp, s.dp, ranks);
      s.first_rank = first;
    }
    // Every segment but the last runs all its forwards, then (at the end) all its backwards.
    const bool last_segment = k + 1 == list.size();
    if (!last_segment) {
      if (layout.contains("schedule") && s.schedule != ScheduleKind::gpipe && s.pp > 1)
        return make_error("{}: a segment before the last runs its micro-batches' forwards first and their "
                          "backwards after the segments behind it, as GPipe does; drop \"schedule\" {} or make "
                          "it \"gpipe\"",
                          label, schedule_name(s.schedule));
      s.schedule = ScheduleKind::gpipe;
      if (layout.contains("overlap_p2p_comm") && s.overlap_p2p_comm)
        return make_error("{}: a segment before the last runs GPipe, whose receives overlap_p2p_comm does not "
                          "post ahead (it is the interleaved schedule's); drop \"overlap_p2p_comm\" from this "
                          "segment",
                          label);
    }
    // The whole plan's overlap_p2p_comm (a flag or a top-level field) is for the segments that interleave.
    if (!layout.contains("overlap_p2p_comm"))
      s.overlap_p2p_comm = base.overlap_p2p_comm && s.schedule == ScheduleKind::interleaved && s.pp > 1;
    out.push_back(std::move(s));
  }
  if (base.overlap_p2p_comm && std::none_of(out.begin(), out.end(), [](const Plan& s) { return s.overlap_p2p_comm; }))
    return make_error("overlap_p2p_comm is the interleaved schedule's, and no segment interleaves (only the last "
                      "segment may, with \"schedule\": \"interleaved\" and pp 2 or more); give it one, or drop "
                      "overlap_p2p_comm");
  return out;
}

Status validate_segments(const Plan& p, const ModelSpec& m, int world_size) {
  const ModelBlocks blocks = model_blocks(m);
  int next_block = 0;
  std::vector<bool> used;
  for (std::size_t k = 0; k < p.segments.size(); ++k) {
    const Plan& s = p.segments[k];
    const std::string label = fmt::format("segment {} ('{}')", k, s.segment_name);
    const BlockRange r = block_range(s, m);
    if (r.first != next_block)
      return make_error("{} starts at block {}, but {}; segments must cover the model's blocks 0..{} in order, "
                        "each where the one before ends",
                        label, r.first,
                        next_block == 0 ? std::string("the first segment must start at block 0")
                                        : fmt::format("the segment before ends at block {}", next_block - 1),
                        blocks.size() - 1);
    next_block = r.last + 1;
    if (model_io(m).routes_to_experts)
      return make_error("{}: mixture-of-experts models run under one plan for the whole model (their router "
                        "statistics are per plan); drop \"segments\"", label);
    if (s.cp != 1 || s.ep != 1)
      return make_error("{}: context and expert parallelism are not available inside segments (cp {}, ep {})",
                        label, s.cp, s.ep);
    if (Status v = validate_plan(s, m); !v.ok()) return std::move(v.context(label)).error();
    if (s.schedule == ScheduleKind::interleaved && k + 1 < p.segments.size())
      return make_error("{}: only the last segment may interleave its stages", label);
    const int first = s.first_rank, count = s.world_size();
    if (used.size() < static_cast<std::size_t>(first + count)) used.resize(static_cast<std::size_t>(first + count));
    for (int r2 = first; r2 < first + count; ++r2) used[static_cast<std::size_t>(r2)] = true;
    if (k > 0) {
      const Plan& prev = p.segments[k - 1];
      const int a0 = prev.first_rank, a1 = prev.first_rank + prev.world_size();
      const bool same = a0 == first && a1 == first + count, disjoint = a1 <= first || first + count <= a0;
      if (!same && !disjoint)
        return make_error("{} runs on ranks [{}, {}] and the segment before on [{}, {}]: consecutive segments "
                          "must share their ranks or use disjoint ones",
                          label, first, first + count - 1, a0, a1 - 1);
    }
  }
  if (next_block != static_cast<int>(blocks.size()))
    return make_error("the segments end at block {} but the model has {} blocks (0..{}); the last segment must "
                      "hold the head",
                      next_block - 1, blocks.size(), blocks.size() - 1);
  const Plan& front = p.segments.front();
  if (m.tied_embeddings && !(front.embedding && front.head))
    return make_error("model '{}' ties its embedding and head, which then must be in one segment; untie them "
                      "(\"tied_embeddings\": false) or use one segment for the whole model",
                      m.name);
  for (std::size_t r = 0; r < used.size(); ++r)
    if (!used[r])
      return make_error("rank {} is in no segment; the segments use ranks 0..{} with gaps", r, used.size() - 1);
  if (world_size > 0 && world_size != p.world_size())
    return make_error("world size {} != the {} ranks the segments use", world_size, p.world_size());
  return ok_status();
}

std::string describe_blocks(const ModelSpec& m) {
  std::string out;
  const ModelBlocks blocks = model_blocks(m);
  for (std::size_t i = 0; i < blocks.size(); ++i)
    out += fmt::format("  block {:>3}  {:<10} layer {}\n", i, blocks[i]->module(), blocks[i]->layer());
  return out;
}

std::string describe_segments(const Plan& p, const ModelSpec& m) {
  const ModelBlocks blocks = model_blocks(m);
  std::string out;
  for (std::size_t k = 0; k < p.segments.size(); ++k) {
    const Plan& s = p.segments[k];
    const BlockRange r = block_range(s, m);
    std::vector<std::string> modules;  // in model order
    for (int i = r.first; i <= r.last; ++i)
      if (modules.empty() || modules.back() != blocks[static_cast<std::size_t>(i)]->module())
        modules.push_back(blocks[static_cast<std::size_t>(i)]->module());
    out += fmt::format("segment {} '{}': blocks {}-{} ({}), ranks {}-{}: tp {} pp {} dp {} vpp {}, {} micro-batch(es) "
                       "of {} per replica, zero {}, recompute {}, schedule {}{}{}\n",
                       k, s.segment_name, r.first, r.last, fmt::join(modules, ", "), s.first_rank,
                       s.first_rank + s.world_size() - 1, s.tp, s.pp, s.dp, s.vpp, s.microbatches(), s.micro_batch,
                       s.zero, recompute_label(s), schedule_name(s.schedule),
                       s.overlap_p2p_comm ? " (p2p overlapped)" : "", s.sequence_parallel ? ", sequence parallel" : "");
  }
  // Per rank: what each segment gives it (its coordinates and its blocks there).
  for (int rank = 0; rank < p.world_size(); ++rank) {
    std::string line = fmt::format("  rank {:>3}:", rank);
    for (std::size_t k = 0; k < p.segments.size(); ++k) {
      const Plan& s = p.segments[k];
      if (!s.holds_rank(rank)) continue;
      const Mesh mesh(s);
      const Coord c = mesh.coord_of(rank);
      std::vector<std::string> held;
      for (int chunk = 0; chunk < s.vpp; ++chunk) {
        const LayerRange layers = virtual_stage_layers(m, s.stage_split(), chunk * s.pp + c.pp);
        int first = layers.begin + 1, last = layers.end;  // block indices of the body layers
        if (chunk == 0 && c.pp == 0 && s.embedding) first = 0;
        if (chunk == s.vpp - 1 && c.pp == s.pp - 1 && s.head) last = m.layers + 1;
        held.push_back(first <= last ? fmt::format("{}-{}", first, last) : std::string("-"));
      }
      line += fmt::format(" | seg {} tp {}/{} dp {}/{} stage {}/{} blocks {}", k, c.tp, s.tp, c.dp, s.dp, c.pp, s.pp,
                          fmt::join(held, ","));
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace meshtrain
