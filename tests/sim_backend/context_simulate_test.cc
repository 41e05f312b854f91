// Context parallelism on the sim backend: the keys and values every layer
// exchanges (all-gather and reduce-scatter, or the ring's send/recv), counted
// from the model's shapes, and attention cut by the ranks' chunk pairs.
#include <catch2/catch.hpp>

#include <string>

#include "engine/simulation.h"

using namespace meshtrain;

namespace {

constexpr int kSeq = 16384;

Plan context_plan(const ModelSpec& m, int cp, ContextComm comm = ContextComm::all_gather) {
  Plan p;
  p.tp = 8, p.cp = cp, p.micro_batch = 1, p.global_batch = 1, p.seq_len = kSeq;
  p.cp_comm = comm;
  const Status valid = validate_plan(p, m, p.world_size());
  INFO((valid.ok() ? std::string() : valid.error().message()));
  REQUIRE(valid.ok());
  return p;
}

SimulationResult simulate(const ModelSpec& m, const Plan& p) {
  SimulateOptions o;
  auto cluster = sim::cluster_preset("dgx-h100");
  REQUIRE(cluster.ok());
  o.cluster = *cluster;
  auto r = simulate_iteration(m, p, o);
  INFO((r.ok() ? std::string() : r.error().message()));
  REQUIRE(r.ok());
  return std::move(r).value();
}

const SimCollectiveStats& stats(const SimulationResult& r, sim::CollectiveKind k) {
  return r.collectives[static_cast<std::size_t>(k)];
}

}  // namespace

TEST_CASE("simulated context parallelism exchanges each layer's keys and values", "[sim][cp]") {
  const ModelSpec m = *model_preset("llama3-8b");  // 8 kv heads of 128: one per tp rank
  const double kv_bytes_per_token = 2.0 * (m.kv_heads / 8) * m.head_dim() * 2;  // K and V, bf16
  const SimulationResult one = simulate(m, context_plan(m, 1));
  CHECK(stats(one, sim::CollectiveKind::kAllGather).count == 0);
  for (int cp : {2, 4}) {
    INFO("cp " << cp);
    const SimulationResult r = simulate(m, context_plan(m, cp));
    // Forward: every layer all-gathers the whole sequence's K and V; backward reduce-scatters their gradients.
    const SimCollectiveStats& gather = stats(r, sim::CollectiveKind::kAllGather);
    CHECK(gather.count == static_cast<std::uint64_t>(m.layers));
    CHECK(gather.bytes == Approx(m.layers * kSeq * kv_bytes_per_token));
    const SimCollectiveStats& scatter = stats(r, sim::CollectiveKind::kReduceScatter);
    CHECK(scatter.count == static_cast<std::uint64_t>(m.layers));
    CHECK(scatter.bytes == Approx(m.layers * kSeq * kv_bytes_per_token));
    // cp times the GPUs on one sequence: faster, but by less than cp (the exchange, the shorter GEMMs).
    CHECK(r.iteration_s < one.iteration_s);
    CHECK(r.iteration_s > one.iteration_s / cp);
    // The ring moves the same blocks as cp - 1 neighbour steps each way, in place of the collectives.
    const SimulationResult ring = simulate(m, context_plan(m, cp, ContextComm::ring));
    CHECK(stats(ring, sim::CollectiveKind::kAllGather).count == 0);
    const SimCollectiveStats& p2p = stats(ring, sim::CollectiveKind::kSendRecv);
    CHECK(p2p.count == static_cast<std::uint64_t>(2 * 2 * (cp - 1) * m.layers));  // a send and a recv per step
    CHECK(p2p.bytes == Approx(2.0 * 2 * (cp - 1) * m.layers * kSeq / cp * kv_bytes_per_token));
  }
}

TEST_CASE("simulated ZB-H1 shrinks 1F1B's bubble", "[sim][zb]") {
  const ModelSpec m = *model_preset("llama3-8b");
  Plan p;
  p.tp = 8, p.pp = 4, p.micro_batch = 1, p.global_batch = 8, p.seq_len = 4096;
  REQUIRE(validate_plan(p, m, p.world_size()).ok());
  const SimulationResult one = simulate(m, p);
  p.schedule = ScheduleKind::zb_h1;
  REQUIRE(validate_plan(p, m, p.world_size()).ok());
  const SimulationResult zb = simulate(m, p);
  INFO("1f1b " << one.iteration_s << " s, bubble " << one.bubble_fraction << "; zb-h1 " << zb.iteration_s
               << " s, bubble " << zb.bubble_fraction);
  CHECK(zb.bubble_fraction < one.bubble_fraction);
  CHECK(zb.iteration_s < one.iteration_s);
}
