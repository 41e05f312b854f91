#include "engine/planner/segment_candidates.h"

#include <algorithm>
#include <mutex>

#include <fmt/format.h>
#include <tbb/parallel_for.h>

#include "engine/segments/segment_plan.h"
#include "engine/step_engine.h"
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

// (tp, pp, dp) over `ranks` GPUs: tp a power of two up to a node dividing them, pp up to `max_pp` (a
// stage needs a body layer) dividing what is left, dp the rest.
struct Degrees {
  int tp = 1, pp = 1, dp = 1;
};
std::vector<Degrees> degrees_over(int ranks, int gpus_per_node, int max_pp) {
  std::vector<Degrees> out;
  for (int tp = 1; tp <= std::min(ranks, gpus_per_node); tp *= 2) {
    if (ranks % tp != 0) continue;
    for (int pp = 1; pp <= std::min(ranks / tp, std::max(1, max_pp)); ++pp)
      if ((ranks / tp) % pp == 0) out.push_back({tp, pp, ranks / tp / pp});
  }
  return out;
}

nlohmann::json segment_json(const Module& from, const Module& to, const Degrees& d, int first_rank,
                            int microbatches) {
  return {{"name", from.name == to.name ? from.name : from.name + ".." + to.name},
          {"blocks", {from.first, to.last}},
          {"ranks", {first_rank, first_rank + d.tp * d.pp * d.dp - 1}},
          {"tp", d.tp},
          {"pp", d.pp},
          {"dp", d.dp},
          {"microbatches", microbatches}};
}

}  // namespace

bool has_segment_layouts(const ModelSpec& m) {
  return m.vision() && !m.moe() && !m.tied_embeddings && modules_of(m).size() >= 2;
}

SegmentEnumeration enumerate_segment_candidates(const SearchContext& ctx) {
  SegmentEnumeration e;
  const ModelSpec& m = ctx.model;
  if (ctx.gpus < 2 || !has_segment_layouts(m)) return e;
  const std::vector<Module> modules = modules_of(m);
  const int n = ctx.gpus, global = ctx.base.effective_global_batch();
  // (ranks of A, or 0 for the same ranks as B)
  std::vector<int> splits = {0};
  if (n % 2 == 0) splits.push_back(n / 2);
  if (n % 4 == 0 && n >= 4) splits.push_back(n / 4), splits.push_back(3 * n / 4);
  std::vector<nlohmann::json> lists;
  for (std::size_t cut = 1; cut < modules.size(); ++cut) {
    const Module &a_from = modules.front(), &a_to = modules[cut - 1];
    const Module &b_from = modules[cut], &b_to = modules.back();
    for (int a_ranks : splits) {
      const int b_ranks = a_ranks == 0 ? n : n - a_ranks;
      // B's body blocks: all but the model's first (the embedding) and last (the head).
      const int b_body = std::min(b_to.last, modules.back().last - 1) - std::max(b_from.first, 1) + 1;
      for (const Degrees& da : degrees_over(a_ranks == 0 ? n : a_ranks, ctx.gpus_per_node, 1))
        for (const Degrees& db : degrees_over(b_ranks, ctx.gpus_per_node, b_body)) {
          if (a_ranks == 0 && da.tp == db.tp && db.pp == 1) continue;  // a uniform plan's layout
          for (int micro : {1, 2, 4, 8, 16}) {
            if (global % (da.dp * micro) != 0 || global % (db.dp * micro) != 0) continue;
            lists.push_back(nlohmann::json::array(
                {segment_json(a_from, a_to, da, 0, micro), segment_json(b_from, b_to, db, a_ranks, micro)}));
          }
        }
    }
  }
  e.combinations = static_cast<std::int64_t>(lists.size());
  std::vector<std::optional<SegmentCandidate>> checked(lists.size());
  std::mutex rejection_mutex;  // guards e.example_rejection
  tbb::parallel_for(std::size_t{0}, lists.size(), [&](std::size_t i) {
    Plan p = ctx.base;
    Status s = ok_status();
    auto parsed = segments_from_json(lists[i], m, p);
    if (parsed) {
      p.segments = std::move(parsed).value();
      s = validate_plan(p, m, ctx.gpus);
      for (const Plan& seg : p.segments)
        if (s) s = StepEngine::supports(seg);
    } else {
      s = parsed.error();
    }
    if (s) {
      checked[i] = SegmentCandidate{std::move(p), lists[i]};
    } else {
      std::lock_guard lock(rejection_mutex);
      if (!e.example_rejection) e.example_rejection = fmt::format("{}: {}", lists[i].dump(), s.error().message());
    }
  });
  for (auto& c : checked)
    if (c) e.valid.push_back(std::move(*c));
  return e;
}

std::string describe_segments_short(const Plan& p) {
  std::string out;
  for (std::size_t k = 0; k < p.segments.size(); ++k) {
    const Plan& s = p.segments[k];
    out += fmt::format("{}{} tp {}{} dp {}", k == 0 ? "" : " | ", s.segment_name, s.tp,
                       s.pp > 1 ? fmt::format(" pp {}", s.pp) : std::string(), s.dp);
    if (k > 0 && s.first_rank != p.segments[k - 1].first_rank) out += fmt::format(" @{}", s.first_rank);
  }
  return out + fmt::format(" m {}", p.segments.back().microbatches());
}

}  // namespace meshtrain::planner
