// Tensor-parallel communication overlap on the sim backend
// (ChunkOptions::tp_comm_overlap): one column-parallel layer under sequence
// parallelism on two simulated tp ranks, its all-gather pipelined with the
// GEMM's row blocks, against the op costs each timed alone.
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "backends/sim/sim_cluster.h"
#include "models/block_context.h"
#include "models/parameter_store.h"

using namespace meshtrain;

namespace {

constexpr DType kAct = DType::bf16;

// Rows R per rank (the sequence shard), width C in, F out (tp 2 keeps F/2 columns).
struct Layer {
  std::int64_t R, C, F;
  int gpus_apart;  // 1: NVLink in one node; 8: the next node, over the network
};

Result<std::unique_ptr<SimCluster>> pair_cluster(const Layer& l) {
  auto spec = sim::cluster_preset("dgx-h100");
  if (!spec) return std::move(spec).error();
  return SimCluster::create(*spec, l.gpus_apart + 1, {0, l.gpus_apart});
}

// The layer's forward on both ranks: iteration and rank 0's compute seconds.
std::pair<double, double> run_layer(const Layer& l, bool overlap) {
  auto made = pair_cluster(l);
  REQUIRE(made.ok());
  SimCluster& cluster = **made;
  const ModelSpec m = *model_preset("llama3-8b");
  const Group group{0, {0, l.gpus_apart}};
  std::vector<std::unique_ptr<ParameterStore>> stores;
  std::vector<std::unique_ptr<BlockContext>> contexts;
  for (int r = 0; r < 2; ++r) {
    SimBackend& b = cluster.backend(group.ranks[static_cast<std::size_t>(r)]);
    ChunkOptions options;
    options.storage.value_dtype = kAct;
    options.sequence_parallel = true;
    options.tp_comm_overlap = overlap;
    const ParamInfo w{"fc.weight", 0, {l.C, l.F}, TpSplit::column, 1, {l.F}, true, true};
    stores.push_back(std::make_unique<ParameterStore>(b, m, std::vector<ParamInfo>{w}, ShardCoord{r, 2},
                                                      options.storage));
    contexts.push_back(std::make_unique<BlockContext>(b, m, *stores.back(), TensorParallel{group, r, 2}, options));
    Tensor x = b.empty(Shape{l.R, l.C}, kAct), y;
    contexts.back()->linear("fc", x, y, LinearKind::column);
    REQUIRE(y.shape() == Shape{2 * l.R, l.F / 2});
  }
  auto run = cluster.run();
  INFO((run.ok() ? std::string() : run.error().message()));
  REQUIRE(run.ok());
  return {run->iteration_s, run->ranks[0].compute_s};
}

// Seconds of what `issue` does on both ranks, alone on the pair.
template <class F>
double timed_pair(const Layer& l, F issue) {
  auto made = pair_cluster(l);
  REQUIRE(made.ok());
  for (int r = 0; r < 2; ++r) issue((*made)->backend(r == 0 ? 0 : l.gpus_apart), r);
  auto run = (*made)->run();
  REQUIRE(run.ok());
  return run->iteration_s;
}

}  // namespace

TEST_CASE("simulated tp comm overlap hides the all-gather under the column-parallel GEMM's row blocks",
          "[sim][tp_overlap]") {
  // Without the overlap the layer is the all-gather A, then the whole GEMM G. With it (tp 2): the own
  // shard's copy K, then the other shard's transfer X beside the own rows' GEMM g, then the other
  // rows' GEMM g. A transfer slows the compute beside it by 1 + s (CostConstants::
  // comm_compute_slowdown): the first GEMM covers the transfer when X <= g·(1 + s), costing the
  // layer X·s/(1 + s) over its compute; otherwise X - g are exposed.
  for (const Layer l : {Layer{4096, 8192, 28672, 1}, Layer{4096, 8192, 28672, 8}, Layer{512, 8192, 1024, 8}}) {
    INFO("R " << l.R << ", C " << l.C << ", F " << l.F << ", ranks " << l.gpus_apart << " GPUs apart");
    const double A = timed_pair(l, [&](SimBackend& b, int) {
      Tensor shard = b.empty(Shape{l.R, l.C}, kAct), full = b.empty(Shape{2 * l.R, l.C}, kAct);
      b.all_gather(shard, full, Group{0, {0, l.gpus_apart}});
    });
    const double X = timed_pair(l, [&](SimBackend& b, int r) {
      Tensor mine = b.empty(Shape{l.R * l.C}, kAct), theirs = b.empty(Shape{l.R * l.C}, kAct);
      // The ring step's counts: to the other rank and from it, nothing to itself.
      std::vector<std::int64_t> send{0, 0}, recv{0, 0};
      send[static_cast<std::size_t>(1 - r)] = recv[static_cast<std::size_t>(1 - r)] = l.R * l.C;
      b.all_to_all(mine, send, theirs, recv, Group{0, {0, l.gpus_apart}});
    });
    auto gemm_alone = [&](std::int64_t rows) {
      return timed_pair(l, [&](SimBackend& b, int r) {
        if (r != 0) return;
        Tensor a = b.empty(Shape{rows, l.C}, kAct), w = b.empty(Shape{l.C, l.F / 2}, kAct),
               c = b.empty(Shape{rows, l.F / 2}, kAct);
        b.gemm(a, w, c, GemmOp{});
      });
    };
    const double G = gemm_alone(2 * l.R), g = gemm_alone(l.R);
    const double K = timed_pair(l, [&](SimBackend& b, int r) {
      if (r != 0) return;
      Tensor src = b.empty(Shape{l.R, l.C}, kAct), dst = b.empty(Shape{2 * l.R, l.C}, kAct);
      Tensor part = dst.rows(0, l.R);
      b.copy(src, part);
    });
    auto made = pair_cluster(l);
    REQUIRE(made.ok());
    const double s = (*made)->cost_model().constants().comm_compute_slowdown;
    const auto [plain, plain_compute] = run_layer(l, false);
    const auto [ring, ring_compute] = run_layer(l, true);
    INFO("all-gather " << A << " s, ring step " << X << " s, GEMM " << G << " s, row block " << g << " s, copy " << K
                       << " s, slowdown " << s << "; layer " << plain << " s without, " << ring << " s with");
    CHECK(plain == Approx(A + G).epsilon(1e-3));
    CHECK(plain - plain_compute == Approx(A).epsilon(1e-3));  // all of the all-gather exposed
    const bool hidden = X <= g * (1 + s);
    const double exposed = hidden ? X * s / (1 + s) : X - g;
    CHECK(ring - ring_compute == Approx(exposed).epsilon(1e-3));
    CHECK(ring == Approx(K + 2 * g + exposed).epsilon(1e-3));
    CHECK(exposed < A);
    CHECK(ring < plain);
  }
}
