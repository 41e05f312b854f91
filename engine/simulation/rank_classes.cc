#include "engine/simulation/rank_classes.h"

#include <algorithm>
#include <map>

#include "engine/plan/mesh.h"
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

bool holds(const Plan& s, int rank) { return rank >= s.first_rank && rank < s.first_rank + s.world_size(); }

// Where rank `rank` sits in each segment, (stage, tp, cp), -1s where it is
// not in the segment; then, per boundary, the samples whose activations and
// gradients it sends to itself (a rank that is both the producer's and the
// consumer's end keeps what both hold), -1s where it is not both.
std::vector<int> place(const Plan& p, const std::vector<Mesh>& meshes, const std::vector<SampleLayout>& layouts,
                       int rank) {
  std::vector<int> out;
  for (std::size_t k = 0; k < p.segments.size(); ++k) {
    if (!holds(p.segments[k], rank)) {
      out.insert(out.end(), {-1, -1, -1});
      continue;
    }
    const Coord x = meshes[k].coord_of(rank);
    out.insert(out.end(), {x.pp, x.tp, x.cp});
  }
  for (std::size_t k = 0; k + 1 < p.segments.size(); ++k) {
    const Plan &producer = p.segments[k], &consumer = p.segments[k + 1];
    const bool both = holds(producer, rank) && holds(consumer, rank);
    const Coord a = both ? meshes[k].coord_of(rank) : Coord{}, b = both ? meshes[k + 1].coord_of(rank) : Coord{};
    if (!both || a.pp != producer.pp - 1 || b.pp != 0) {
      out.insert(out.end(), {-1, -1});
      continue;
    }
    const SampleRange x = replica_samples(layouts[k], a.dp), y = replica_samples(layouts[k + 1], b.dp);
    const int kept = static_cast<int>(std::max<std::int64_t>(0, std::min(x.end, y.end) - std::max(x.begin, y.begin)));
    // segment_boundary.h: activations go from producer tp t to consumer tp t' with t' mod tp_P = t, gradients
    // return from consumer tp t mod tp_C.
    out.push_back(b.tp % producer.tp == a.tp ? kept : 0);
    out.push_back(a.tp % consumer.tp == b.tp ? kept : 0);
  }
  return out;
}

// The ranks `rank` waits for besides its collectives' members: the other
// pipeline stages of its (tp, cp, dp) column in every segment, and across a
// boundary between disjoint ranks the peers whose pieces it receives
// (segment_boundary.h): a consumer's first stage receives activations from
// the producer's last-stage ranks holding its samples, a producer's last
// stage their gradients from the consumer's first-stage ranks.
std::vector<int> waits_for(const Plan& p, const std::vector<Mesh>& meshes, const std::vector<SampleLayout>& layouts,
                           int rank) {
  std::vector<int> out;
  for (std::size_t k = 0; k < p.segments.size(); ++k) {
    if (!holds(p.segments[k], rank)) continue;
    const Coord c = meshes[k].coord_of(rank);
    for (int s = 0; s < p.segments[k].pp; ++s) out.push_back(meshes[k].rank_of({c.tp, c.cp, c.dp, s}));
  }
  for (std::size_t k = 0; k + 1 < p.segments.size(); ++k) {
    const Plan &producer = p.segments[k], &consumer = p.segments[k + 1];
    if (producer.first_rank == consumer.first_rank) continue;  // the same ranks: an all-to-all
    const bool consumes = holds(consumer, rank);
    if (!consumes && !holds(producer, rank)) continue;
    const std::size_t mine = consumes ? k + 1 : k, theirs = consumes ? k : k + 1;
    const Coord c = meshes[mine].coord_of(rank);
    if (c.pp != (consumes ? 0 : producer.pp - 1)) continue;
    const SampleRange own = replica_samples(layouts[mine], c.dp);
    const Plan& other = p.segments[theirs];
    for (int d = 0; d < other.dp; ++d) {
      const SampleRange x = replica_samples(layouts[theirs], d);
      if (std::max(x.begin, own.begin) >= std::min(x.end, own.end)) continue;
      out.push_back(meshes[theirs].rank_of({c.tp % other.tp, 0, d, consumes ? other.pp - 1 : 0}));
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
  // The lowest rank of each class, and every rank a chosen one waits for: a
  // stage then waits for its simulated neighbours (the bubble), not for a
  // send's analytic time.
  std::vector<int> work;
  for (int r = 0; r < p.world_size(); ++r)
    if (chosen[static_cast<std::size_t>(r)]) work.push_back(r);
  while (!work.empty()) {
    const int r = work.back();
    work.pop_back();
    for (int peer : waits_for(p, meshes, layouts, r))
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
