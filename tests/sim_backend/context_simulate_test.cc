// Context parallelism on the sim backend: the keys and values every layer
// exchanges (all-gather and reduce-scatter, or the ring's send/recv), counted
// from the model's shapes, and attention cut by the ranks' chunk pairs.
#include <catch2/catch.hpp>

#include <string>

#include "backends/sim/sim_cluster.h"
#include "engine/simulation/simulation.h"
#include "models/block_context.h"
#include "models/context_parallel.h"
#include "models/parameter_store.h"
#include "tests/sim_backend/sim_testing.h"

using namespace meshtrain;
using namespace meshtrain::sim_testing;

namespace {

constexpr int kSeq = 16384;

Plan context_plan(const ModelSpec& m, int cp, ContextComm comm = ContextComm::all_gather) {
  Plan p;
  p.tp = 8, p.cp = cp, p.micro_batch = 1, p.global_batch = 1, p.seq_len = kSeq;
  p.cp_comm = comm;
  return checked(p, m);
}

SimulationResult simulate(const ModelSpec& m, const Plan& p) { return simulated(m, p, on_cluster("dgx-h100")); }

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

namespace {

// One layer's ring attention forward on two simulated ranks (cp 2), B 1,
// T = 4c, H query and G kv heads of 128, with the ranks `gpus_apart`: what
// the sim reports, and the op costs timed alone.
struct RingRun {
  double iteration_s, compute_s, transfer_s, own_block_s, slowdown;
};

RingRun ring_forward(std::int64_t c, int G, int gpus_apart) {
  constexpr int H = 8, D = 128;
  const int S = H + 2 * G;
  const std::int64_t L = 2 * c;  // each rank's two chunks
  const ModelSpec m = *model_preset("llama3-8b");
  auto spec = sim::cluster_preset("dgx-h100");
  REQUIRE(spec.ok());
  const int world = gpus_apart + 1;
  const Group group{0, {0, gpus_apart}};
  AttentionOp op{H, G, D, 0.088f};
  auto made = SimCluster::create(*spec, world, {0, gpus_apart});
  REQUIRE(made.ok());
  SimCluster& cluster = **made;
  DType act = DType::f32;
  std::vector<std::unique_ptr<ParameterStore>> stores;
  std::vector<std::unique_ptr<BlockContext>> contexts;
  std::vector<ContextAttentionSaved> saved(2);
  for (int r = 0; r < 2; ++r) {
    SimBackend& b = cluster.backend(group.ranks[static_cast<std::size_t>(r)]);
    stores.push_back(std::make_unique<ParameterStore>(b, m, std::vector<ParamInfo>{}, ShardCoord{}));
    ChunkOptions options;
    options.context = ContextParallel{group, r, 2, ContextComm::ring};
    contexts.push_back(std::make_unique<BlockContext>(b, m, *stores.back(),
                                                      TensorParallel{Group{1 + r, {group.ranks[static_cast<std::size_t>(r)]}}, 0, 1},
                                                      options));
    act = contexts.back()->act;
    Tensor local = b.empty(Shape{L, S * D}, act);
    context_attention_forward(*contexts.back(), 1, L, local, op, 0.f, saved[static_cast<std::size_t>(r)]);
  }
  auto run = cluster.run();
  REQUIRE(run.ok());
  RingRun out{run->iteration_s, run->ranks[0].compute_s, 0, 0, cluster.cost_model().constants().comm_compute_slowdown};

  // The op costs, each timed alone. The transfer: both ranks send their (L·2G, D) block to each
  // other and receive the other's, on a stream of their own, as the ring's single step does.
  auto pair = SimCluster::create(*spec, world, {0, gpus_apart});
  REQUIRE(pair.ok());
  for (int r = 0; r < 2; ++r) {
    SimBackend& b = (*pair)->backend(group.ranks[static_cast<std::size_t>(r)]);
    const int peer = group.ranks[static_cast<std::size_t>(1 - r)];
    StreamScope on(b, b.create_stream("ring"));
    Tensor mine = b.empty(Shape{L * 2 * G, D}, act), theirs = b.empty(Shape{L * 2 * G, D}, act);
    b.send(mine, peer, 0);
    b.recv(theirs, peer, 0);
  }
  auto moved = (*pair)->run();
  REQUIRE(moved.ok());
  out.transfer_s = moved->iteration_s;
  // The attention rank 0 can do before the other block arrives: its own block, chunks 0 and 3,
  // against its queries of chunks 0 and 3: (0, 0) and (3, 3) causal and (3, 0) whole, each
  // gathered into a (1, c, S, D) qkv, the third merged into the second.
  auto alone = SimCluster::create(*spec, 1, {0});
  REQUIRE(alone.ok());
  SimBackend& b = (*alone)->backend(0);
  Tensor src = b.empty(Shape{L * S + 2 * L * 2 * G, D}, act), idx = b.empty(Shape{c * S}, DType::i32);
  Tensor out_a = b.empty(Shape{1, c, H, D}, act), lse_a = b.empty(Shape{1, H, c});
  Tensor out_b = b.empty(Shape{1, c, H, D}, act), lse_b = b.empty(Shape{1, H, c});
  for (const bool causal : {true, false, true}) {
    Tensor qkv = b.empty(Shape{1, c, S, D}, act);
    b.gather_rows(src, idx, qkv);
    AttentionOp pair_op = op;
    pair_op.causal = causal;
    b.attention_forward(qkv, causal ? out_a : out_b, causal ? lse_a : lse_b, pair_op);
  }
  b.attention_merge(out_b, lse_b, out_a, lse_a);
  auto own = (*alone)->run();
  REQUIRE(own.ok());
  out.own_block_s = own->ranks[0].compute_s;
  return out;
}

}  // namespace

TEST_CASE("simulated ring attention hides a block's transfer under the attention before it", "[sim][cp][ring]") {
  // The ring's one step (cp 2) moves the other rank's block while this rank attends to its own.
  // A transfer of X seconds slows the compute beside it by the factor 1 + s
  // (CostConstants::comm_compute_slowdown); the own block's attention (A seconds alone) then either
  // covers it, costing the layer X·s/(1 + s) over its compute, or not (X > A·(1 + s)): X - A.
  struct Case {
    std::int64_t c;
    int kv_heads, gpus_apart;  // 1: NVLink in one node; 8: the next node, over the network
    bool hidden;
  };
  for (const Case k : {Case{512, 8, 8, false}, Case{8192, 8, 8, true}, Case{8192, 1, 1, true}}) {
    INFO("chunk " << k.c << ", " << k.kv_heads << " kv heads, ranks " << k.gpus_apart << " GPUs apart");
    const RingRun r = ring_forward(k.c, k.kv_heads, k.gpus_apart);
    INFO("iteration " << r.iteration_s << " s, compute " << r.compute_s << " s, transfer " << r.transfer_s
                      << " s, own block " << r.own_block_s << " s");
    const double X = r.transfer_s, A = r.own_block_s, s = r.slowdown;
    CHECK((X <= A * (1 + s)) == k.hidden);
    const double exposed = k.hidden ? X * s / (1 + s) : X - A;
    CHECK(r.iteration_s - r.compute_s == Approx(exposed).epsilon(1e-3));
    // Without the overlap the whole transfer would add to the compute.
    CHECK(r.iteration_s < r.compute_s + X);
  }
}
