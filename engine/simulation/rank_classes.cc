#include "engine/simulation/rank_classes.h"

#include <algorithm>
#include <map>
#include <optional>

#include "engine/plan/mesh.h"
#include "engine/plan/segment_plan.h"
#include "engine/step/segment_boundary.h"

namespace meshtrain {

namespace {

RankClasses uniform_classes(const Plan& p) {
  const Mesh mesh(p);
  RankClasses c;
  for (int stage = 0; stage < p.pp; ++stage) {
    c.representatives.push_back(mesh.rank_of(Coord{0, 0, 0, stage}));
    c.stands_for.push_back(p.tp * p.cp * p.dp);
  }
  for (int rank = 0; rank < p.world_size(); ++rank) c.class_of.push_back(mesh.coord_of(rank).pp);
  c.classes = p.pp;
  return c;
}

// The samples of the global batch that replica d of `segment` holds, over all its micro-batches.
SampleRange replica_samples(const SampleLayout& layout, int d) {
  const auto& mine = layout[static_cast<std::size_t>(d)];
  return {mine.front().begin, mine.back().end};
}

// Rank `rank`'s end of boundary k (segments k and k + 1) on disjoint ranks:
// the consumer's first stage or the producer's last, with the segment it
// sits in there and the other one; nullopt where it is neither.
struct BoundaryEnd {
  std::size_t mine, theirs;
  Coord at;
  bool consumer;
};
std::optional<BoundaryEnd> disjoint_end(const Plan& p, const std::vector<Mesh>& meshes, std::size_t k, int rank) {
  const Plan &producer = p.segments[k], &consumer = p.segments[k + 1];
  if (producer.first_rank == consumer.first_rank) return std::nullopt;  // the same ranks: an all-to-all
  const bool consumes = consumer.holds_rank(rank);
  if (!consumes && !producer.holds_rank(rank)) return std::nullopt;
  const std::size_t mine = consumes ? k + 1 : k;
  const Coord c = meshes[mine].coord_of(rank);
  if (c.pp != (consumes ? 0 : producer.pp - 1)) return std::nullopt;
  return BoundaryEnd{mine, consumes ? k : k + 1, c, consumes};
}

std::int64_t overlap(const SampleRange& a, const SampleRange& b) {
  return std::max<std::int64_t>(0, std::min(a.end, b.end) - std::max(a.begin, b.begin));
}

// Where rank `rank` sits in each segment, (stage, tp, cp), -1s where it is
// not in the segment; then, per boundary on the same ranks, the samples
// whose activations and gradients it sends to itself (a rank that is both
// the producer's and the consumer's end keeps what both hold), and per
// boundary between disjoint ranks, its pieces in order: (own micro-batch,
// the other end's micro-batch, samples), which says when each arrives.
std::vector<int> place(const Plan& p, const std::vector<Mesh>& meshes, const std::vector<SampleLayout>& layouts,
                       int rank) {
  std::vector<int> out;
  for (std::size_t k = 0; k < p.segments.size(); ++k) {
    if (!p.segments[k].holds_rank(rank)) {
      out.insert(out.end(), {-1, -1, -1});
      continue;
    }
    const Coord x = meshes[k].coord_of(rank);
    out.insert(out.end(), {x.pp, x.tp, x.cp});
  }
  for (std::size_t k = 0; k + 1 < p.segments.size(); ++k) {
    if (const auto end = disjoint_end(p, meshes, k, rank)) {
      const auto& own = layouts[end->mine][static_cast<std::size_t>(end->at.dp)];
      for (std::size_t j = 0; j < own.size(); ++j)
        for (const auto& replica : layouts[end->theirs])
          for (std::size_t m = 0; m < replica.size(); ++m)
            if (const std::int64_t n = overlap(own[j], replica[m]); n > 0)
              out.insert(out.end(), {static_cast<int>(j), static_cast<int>(m), static_cast<int>(n)});
      out.push_back(-2);
      continue;
    }
    const Plan &producer = p.segments[k], &consumer = p.segments[k + 1];
    const bool both = producer.holds_rank(rank) && consumer.holds_rank(rank);
    const Coord a = both ? meshes[k].coord_of(rank) : Coord{}, b = both ? meshes[k + 1].coord_of(rank) : Coord{};
    if (!both || a.pp != producer.pp - 1 || b.pp != 0) {
      out.insert(out.end(), {-1, -1});
      continue;
    }
    const auto kept =
        static_cast<int>(overlap(replica_samples(layouts[k], a.dp), replica_samples(layouts[k + 1], b.dp)));
    // segment_boundary.h: activations go from producer tp t to consumer tp t' with t' mod tp_P = t, gradients
    // return from consumer tp t mod tp_C.
    out.push_back(b.tp % producer.tp == a.tp ? kept : 0);
    out.push_back(a.tp % consumer.tp == b.tp ? kept : 0);
  }
  return out;
}

// The ranks `rank` waits for or sends to besides its collectives' members:
// the other pipeline stages of its (tp, cp, dp) column in every segment, and
// across a boundary between disjoint ranks every rank at the other end that
// holds some of its samples (segment_boundary.h: pieces go between the
// producer's last stage and the consumer's first, both ways).
std::vector<int> peers(const Plan& p, const std::vector<Mesh>& meshes, const std::vector<SampleLayout>& layouts,
                       int rank) {
  std::vector<int> out;
  for (std::size_t k = 0; k < p.segments.size(); ++k) {
    if (!p.segments[k].holds_rank(rank)) continue;
    const Coord c = meshes[k].coord_of(rank);
    for (int s = 0; s < p.segments[k].pp; ++s) out.push_back(meshes[k].rank_of({c.tp, c.cp, c.dp, s}));
  }
  for (std::size_t k = 0; k + 1 < p.segments.size(); ++k) {
    const auto end = disjoint_end(p, meshes, k, rank);
    if (!end) continue;
    const SampleRange own = replica_samples(layouts[end->mine], end->at.dp);
    const Plan& other = p.segments[end->theirs];
    for (int d = 0; d < other.dp; ++d) {
      if (overlap(replica_samples(layouts[end->theirs], d), own) == 0) continue;
      for (int t = 0; t < other.tp; ++t)
        out.push_back(meshes[end->theirs].rank_of({t, 0, d, end->consumer ? other.pp - 1 : 0}));
    }
  }
  return out;
}

RankClasses segment_classes(const Plan& p) {
  std::vector<Mesh> meshes;
  std::vector<SampleLayout> layouts;
  for (const Plan& s : p.segments) meshes.emplace_back(s), layouts.push_back(training_layout(s));
  std::map<std::vector<int>, int> index;
  RankClasses c;
  std::vector<int> size;
  std::vector<bool> chosen(static_cast<std::size_t>(p.world_size()), false);
  for (int rank = 0; rank < p.world_size(); ++rank) {
    auto [it, added] = index.emplace(place(p, meshes, layouts, rank), c.classes);
    if (added) ++c.classes, size.push_back(0), chosen[static_cast<std::size_t>(rank)] = true;
    ++size[static_cast<std::size_t>(it->second)];
    c.class_of.push_back(it->second);
  }
  c.position_of = pipeline_positions(p);
  // The lowest rank of each class, and every rank a chosen one exchanges
  // with point to point: a stage then waits for its simulated neighbours
  // (the bubble), and its sends run beside its compute, as a real send does,
  // not as an analytic task on its stream (sim_backend.h).
  std::vector<int> work;
  for (int r = 0; r < p.world_size(); ++r)
    if (chosen[static_cast<std::size_t>(r)]) work.push_back(r);
  while (!work.empty()) {
    const int r = work.back();
    work.pop_back();
    for (int peer : peers(p, meshes, layouts, r))
      if (!chosen[static_cast<std::size_t>(peer)]) chosen[static_cast<std::size_t>(peer)] = true, work.push_back(peer);
  }
  // A class's extra representatives stand for themselves, its lowest rank for the rest.
  std::vector<int> first(static_cast<std::size_t>(c.classes), -1);
  for (int r = 0; r < p.world_size(); ++r) {
    if (!chosen[static_cast<std::size_t>(r)]) continue;
    const auto k = static_cast<std::size_t>(c.class_of[static_cast<std::size_t>(r)]);
    c.representatives.push_back(r);
    c.stands_for.push_back(1);
    if (first[k] < 0) first[k] = static_cast<int>(c.stands_for.size()) - 1;
    else --size[k];
  }
  for (std::size_t k = 0; k < first.size(); ++k) c.stands_for[static_cast<std::size_t>(first[k])] = size[k];
  return c;
}

}  // namespace

RankClasses rank_classes(const Plan& p) { return p.segments.empty() ? uniform_classes(p) : segment_classes(p); }

}  // namespace meshtrain
