// The sim backend on its own: memory accounting, recorded task durations
// from the cost model, and collectives whose other members are not simulated.
#include <catch2/catch.hpp>

#include <vector>

#include "backends/sim/sim_backend.h"

using namespace meshtrain;

namespace {

std::unique_ptr<SimCluster> make_cluster(int world, std::vector<int> reps) {
  auto spec = sim::cluster_preset("dgx-a100");
  REQUIRE(spec.ok());
  auto c = SimCluster::create(*spec, world, std::move(reps));
  REQUIRE(c.ok());
  return std::move(c).value();
}

// One GPU of cluster preset `preset` running the software `o` describes.
std::unique_ptr<SimCluster> one_gpu(const char* preset, const SimOptions& o) {
  auto spec = sim::cluster_preset(preset);
  REQUIRE(spec.ok());
  auto c = SimCluster::create(*spec, 1, {0}, o);
  REQUIRE(c.ok());
  return std::move(c).value();
}

// One dgx-a100 GPU running attention as Megatron-LM 2021 did (AttentionImpl::unfused).
std::unique_ptr<SimCluster> unfused_cluster(float attention_dropout) {
  SimOptions o;
  o.kernels.attention = AttentionImpl::unfused;
  o.kernels.dropout = attention_dropout;
  return one_gpu("dgx-a100", o);
}

// Seconds of a simulated time (picoseconds).
double seconds(sim::Time t) { return static_cast<double>(t) / 1e12; }

// One bf16 attention forward and backward of op, on `rows` query rows (op's
// window, or all T) against T keys of batch B, then the run: rank 0's
// compute seconds.
double attention_seconds(SimCluster& cluster, const AttentionOp& op, std::int64_t B, std::int64_t T,
                         std::int64_t rows) {
  const std::int64_t H = op.heads, D = op.head_dim;
  SimBackend& b = cluster.backend(0);
  Tensor qkv = b.empty(Shape{B, T, 3 * H, D}, DType::bf16), out = b.empty(Shape{B, rows, H, D}, DType::bf16);
  Tensor lse = b.empty(Shape{B, H, rows}), dqkv = b.empty(Shape{B, T, 3 * H, D}, DType::bf16);
  b.attention_forward(qkv, out, lse, op);
  b.attention_backward(out, qkv, out, lse, dqkv, op);
  auto r = cluster.run();
  REQUIRE(r.ok());
  return r->ranks[0].compute_s;
}

// Ranks 0..7 on one node; only rank 0 is simulated.
const Group kNodeTp{1, {0, 1, 2, 3, 4, 5, 6, 7}};

// The bf16 operands of the (4096, 1024) · (1024, 2048) GEMM whose output the tests all-reduce over kNodeTp.
struct GemmOperands {
  Tensor a, w, c;
};
GemmOperands tp_gemm_operands(Backend& b) {
  return {b.empty(Shape{4096, 1024}, DType::bf16), b.empty(Shape{1024, 2048}, DType::bf16),
          b.empty(Shape{4096, 2048}, DType::bf16)};
}

double gemm_seconds(const SimCluster& cluster, std::int64_t m, std::int64_t n, std::int64_t k) {
  return static_cast<double>(cluster.cost_model().gemm(m, n, k, sim::DType::kBf16)) / 1e12;
}

// The analytic time of an all-reduce of `bytes` over `g` with nothing else on its links.
double solo_all_reduce_seconds(const SimCluster& cluster, const Group& g, double bytes) {
  sim::CollectiveRequest req{sim::CollectiveKind::kAllReduce, g.ranks, bytes};
  auto plan = sim::plan_collective(cluster.cluster(), sim::CostConstants{}, req);
  REQUIRE(plan.ok());
  return static_cast<double>(sim::analytic_time(cluster.cluster(), sim::CostConstants{}, *plan)) / 1e12;
}

}  // namespace

TEST_CASE("sim backend: live and peak bytes are numel · dtype size of live storage", "[sim_backend]") {
  auto cluster = make_cluster(8, {0});
  SimBackend& b = cluster->backend(0);
  {
    Tensor a = b.empty(Shape{1000, 3});
    Tensor h = b.empty(Shape{7}, DType::bf16);
    CHECK(b.memory_stats().live_bytes == 12000 + 14);
    Tensor v = a.view(Shape{3000});  // a view shares the storage
    CHECK(b.memory_stats().live_bytes == 12014);
  }
  CHECK(b.memory_stats().live_bytes == 0);
  CHECK(b.memory_stats().peak_bytes == 12014);
  b.reset_peak();
  CHECK(b.memory_stats().peak_bytes == 0);
  Tensor x = b.empty(Shape{4}, DType::i32);
  std::vector<float> host(4, 1.f);
  REQUIRE(b.read(x, host).ok());
  CHECK(host == std::vector<float>(4, 0.f));
}

TEST_CASE("sim backend: a gemm takes the cost model's time, a solo tp all-reduce its analytic time",
          "[sim_backend]") {
  auto cluster = make_cluster(8, {0});
  SimBackend& b = cluster->backend(0);
  auto [a, w, c] = tp_gemm_operands(b);
  b.gemm(a, w, c, {});
  b.all_reduce(c, kNodeTp, ReduceOp::sum);
  auto r = cluster->run();
  REQUIRE(r.ok());
  const double gemm_s = gemm_seconds(*cluster, 4096, 2048, 1024);
  const double ar_s = solo_all_reduce_seconds(*cluster, kNodeTp, static_cast<double>(c.bytes()));
  CHECK(r->ranks[0].compute_s == Approx(gemm_s));
  CHECK(r->iteration_s == Approx(gemm_s + ar_s).epsilon(1e-9));
  const auto& ar = r->collectives[static_cast<std::size_t>(sim::CollectiveKind::kAllReduce)];
  CHECK(ar.count == 1);
  CHECK(ar.bytes == static_cast<double>(c.bytes()));
  CHECK(ar.time_s == Approx(ar_s));
  CHECK(r->tasks == 2);
}

TEST_CASE("sim backend: a weight gradient added into an fp32 gradient pays the accumulating epilogue",
          "[sim_backend]") {
  // dW (1024 x 2048, fp32) += xᵀ (1024 x 4096) · dy (4096 x 2048): beta 1 on an fp32 c, as the engine's linear
  // backward issues it; the same product into a fresh bf16 c stores 2 bytes an element and reads none.
  auto cluster = make_cluster(1, {0});
  SimBackend& b = cluster->backend(0);
  Tensor x = b.empty(Shape{4096, 1024}, DType::bf16), dy = b.empty(Shape{4096, 2048}, DType::bf16);
  Tensor dw = b.empty(Shape{1024, 2048});
  b.gemm(x, dy, dw, GemmOp{true, false, 1.f, 1.f});
  auto r = cluster->run();
  REQUIRE(r.ok());
  const sim::CostModel& cost = cluster->cost_model();
  CHECK(r->ranks[0].compute_s ==
        Approx(seconds(cost.gemm(1024, 2048, 4096, sim::DType::kBf16, 1, sim::GemmOutput{4, true}))));
  auto plain = make_cluster(1, {0});
  SimBackend& pb = plain->backend(0);
  Tensor px = pb.empty(Shape{4096, 1024}, DType::bf16), pdy = pb.empty(Shape{4096, 2048}, DType::bf16);
  Tensor fresh = pb.empty(Shape{1024, 2048}, DType::bf16);
  pb.gemm(px, pdy, fresh, GemmOp{true, false});
  auto p = plain->run();
  REQUIRE(p.ok());
  CHECK(p->ranks[0].compute_s == Approx(gemm_seconds(*plain, 1024, 2048, 4096)));
  CHECK(r->ranks[0].compute_s > p->ranks[0].compute_s);
}

TEST_CASE("sim backend: the compute stream's own compute is reported apart from a side stream's",
          "[sim_backend]") {
  // Stream 0: a gemm, then a tp all-reduce; a side stream runs a longer gemm
  // at the same time. What the compute stream spends beyond its own compute is
  // the all-reduce; the side stream's gemm must not be subtracted from it
  // (exposed communication, engine/simulation/simulation.h, would be clamped to 0).
  auto cluster = make_cluster(8, {0});
  SimBackend& b = cluster->backend(0);
  auto [a, w, c] = tp_gemm_operands(b);
  Tensor w2 = b.empty(Shape{1024, 8192}, DType::bf16), c2 = b.empty(Shape{4096, 8192}, DType::bf16);
  const Stream side = b.create_stream("side");
  b.set_stream(side);
  b.gemm(a, w2, c2, {});
  b.set_stream(Stream{0});
  b.gemm(a, w, c, {});
  b.all_reduce(c, kNodeTp, ReduceOp::sum);
  auto r = cluster->run();
  REQUIRE(r.ok());
  const double gemm_s = gemm_seconds(*cluster, 4096, 2048, 1024), side_s = gemm_seconds(*cluster, 4096, 8192, 1024);
  const double ar_s = solo_all_reduce_seconds(*cluster, kNodeTp, static_cast<double>(c.bytes()));
  REQUIRE(side_s > ar_s);  // else the old subtraction would not have hidden the all-reduce
  CHECK(r->ranks[0].compute_s == Approx(gemm_s + side_s));
  CHECK(r->ranks[0].compute_stream_s == Approx(gemm_s));
  CHECK(r->ranks[0].compute_busy_s == Approx(gemm_s + ar_s).epsilon(1e-9));
  CHECK(r->ranks[0].compute_busy_s - r->ranks[0].compute_stream_s == Approx(ar_s).epsilon(1e-9));
}

TEST_CASE("sim backend: unfused attention is the score GEMM, softmax, dropout and context GEMM",
          "[sim_backend][attention]") {
  // Megatron-LM 2021 attention (AttentionImpl::unfused) for B 2, H 4, T 1024, D 64 in bf16.
  const std::int64_t B = 2, H = 4, T = 1024, D = 64, bh = B * H;
  const double s2 = static_cast<double>(bh) * T * T;  // elements of the (b·a, s, s) scores
  for (float dropout : {0.f, 0.1f}) {
    INFO("attention dropout " << dropout);
    const std::unique_ptr<SimCluster> made = unfused_cluster(dropout);
    SimCluster& cluster = *made;
    const AttentionOp op{static_cast<int>(H), static_cast<int>(H), static_cast<int>(D), 0.125f};
    const double compute_s = attention_seconds(cluster, op, B, T, T);
    const sim::CostModel& c = cluster.cost_model();
    const double scores = seconds(c.gemm(T, T, D, sim::DType::kBf16, bh));   // q·kᵀ, dP = dO·vᵀ
    const double context = seconds(c.gemm(T, D, T, sim::DType::kBf16, bh));  // P·v, dV, and dQ, dK below
    // 2-byte scores: softmax reads and writes them (backward also reads P); dropout adds a 1-byte mask.
    const double drop = dropout > 0 ? seconds(c.memory_bound(5 * s2)) : 0.0;
    const double forward = scores + seconds(c.memory_bound(4 * s2)) + drop + context;
    const double backward = context + scores + drop + seconds(c.memory_bound(6 * s2)) +
                            seconds(c.gemm(T, D, T, sim::DType::kBf16, 2 * bh));
    CHECK(compute_s == Approx(forward + backward).epsilon(1e-9));
    // Far slower than the fused kernel, which never writes the scores to HBM.
    const double flash = seconds(c.attention(bh, T, D, true, false, sim::DType::kBf16)) +
                         seconds(c.attention(bh, T, D, true, true, sim::DType::kBf16));
    CHECK(compute_s > 1.5 * flash);
  }
}

TEST_CASE("sim backend: unfused attention of a query window computes only the window's rows",
          "[sim_backend][attention][cp]") {
  // Context parallelism's chunk of c = T/4 query rows (cp 2, chunk 2 of 4) against all T keys.
  const std::int64_t B = 2, H = 4, T = 1024, D = 64, bh = B * H, c = T / 4;
  const std::unique_ptr<SimCluster> made = unfused_cluster(0.f);
  SimCluster& cluster = *made;
  AttentionOp op{static_cast<int>(H), static_cast<int>(H), static_cast<int>(D), 0.125f};
  op.query_begin = 2 * c, op.query_rows = c;
  const double compute_s = attention_seconds(cluster, op, B, T, c);
  const sim::CostModel& cm = cluster.cost_model();
  const double scores = static_cast<double>(bh) * c * T;  // the window's (c, T) scores per (b, h)
  const double qk = seconds(cm.gemm(c, T, D, sim::DType::kBf16, bh));   // q·kᵀ, dP = dO·vᵀ
  const double pv = seconds(cm.gemm(c, D, T, sim::DType::kBf16, bh));   // P·v, dV
  const double forward = qk + seconds(cm.memory_bound(4 * scores)) + pv;
  const double backward =
      pv + qk + seconds(cm.memory_bound(6 * scores)) + seconds(cm.gemm(c, D, T, sim::DType::kBf16, 2 * bh));
  CHECK(compute_s == Approx(forward + backward).epsilon(1e-9));
  // A quarter of the rows: under the whole sequence's unfused cost (by less than 4x: kernel overheads).
  const double whole_forward = seconds(cm.gemm(T, T, D, sim::DType::kBf16, bh)) +
                               seconds(cm.memory_bound(4.0 * bh * T * T)) +
                               seconds(cm.gemm(T, D, T, sim::DType::kBf16, bh));
  CHECK(forward < whole_forward);
}

TEST_CASE("sim backend: a node's all-reduce reaches the busbw nccl-tests measures on DGX A100",
          "[sim_backend][comm]") {
  // nccl-tests all_reduce_perf, 8 A100 on NVSwitch, large messages: ~230 GB/s busbw
  // (CostConstants::nvlink_efficiency 0.77 of 300 GB/s). busbw = S · 2(n−1)/n / t.
  auto cluster = make_cluster(8, {0, 1, 2, 3, 4, 5, 6, 7});
  const Group node{1, {0, 1, 2, 3, 4, 5, 6, 7}};
  const double S = 1024.0 * 1024 * 1024;
  for (int r = 0; r < 8; ++r) {
    Tensor x = cluster->backend(r).empty(Shape{static_cast<std::int64_t>(S / 2)}, DType::bf16);
    cluster->backend(r).all_reduce(x, node, ReduceOp::sum);
  }
  auto r = cluster->run();
  REQUIRE(r.ok());
  const auto& ar = r->collectives[static_cast<std::size_t>(sim::CollectiveKind::kAllReduce)];
  CHECK(ar.bytes == S);  // an all-simulated collective counts its bytes once
  const double busbw = S * 2 * 7 / 8 / r->iteration_s;
  CHECK(busbw == Approx(0.77 * 300e9).epsilon(0.03));
}

TEST_CASE("sim backend: fused attention of a sliding-window layer takes the window's share of the scores",
          "[sim_backend][attention][attention-variants]") {
  // seq 4096, window 1024, causal: Σ_t min(t + 1, 1024) = 3,670,528 of the causal 8,390,656 scores.
  const std::int64_t B = 1, H = 8, G = 2, T = 4096, D = 128;
  auto seconds = [&](std::int64_t window) {
    auto cluster = make_cluster(1, {0});
    SimBackend& b = cluster->backend(0);
    Tensor qkv = b.empty(Shape{B, T, H + 2 * G, D}, DType::bf16), out = b.empty(Shape{B, T, H, D}, DType::bf16);
    Tensor lse = b.empty(Shape{B, H, T});
    AttentionOp op;
    op.heads = H, op.kv_heads = G, op.head_dim = D, op.scale = 0.088f, op.sliding_window = window;
    b.attention_forward(qkv, out, lse, op);
    auto r = cluster->run();
    REQUIRE(r.ok());
    return r->ranks[0].compute_s;
  };
  const double overhead = static_cast<double>(sim::CostConstants{}.kernel_overhead) / 1e12;
  CHECK(seconds(1024) - overhead == Approx((seconds(0) - overhead) * 3670528.0 / 8390656.0).epsilon(1e-6));
}

TEST_CASE("sim backend: the experts' grouped GEMM is one task of the cost model's grouped time",
          "[sim_backend][moe]") {
  // Three experts with 130, 40 and 700 tokens: one kernel of their tiles (simulator/cost_model.h).
  auto cluster = make_cluster(1, {0});
  SimBackend& b = cluster->backend(0);
  const std::int64_t C = 1024, F = 2816;
  std::vector<Tensor> x, w, y;
  for (std::int64_t rows : {130, 40, 700}) {
    x.push_back(b.empty(Shape{rows, C}, DType::bf16));
    w.push_back(b.empty(Shape{C, F}, DType::bf16));
    y.push_back(b.empty(Shape{rows, F}, DType::bf16));
  }
  b.grouped_gemm(x, w, y, GemmOp{});
  auto r = cluster->run();
  REQUIRE(r.ok());
  CHECK(r->tasks == 1);
  CHECK(r->ranks[0].compute_s ==
        Approx(seconds(cluster->cost_model().grouped_gemm({130, 40, 700}, F, C, sim::DType::kBf16))));
}

TEST_CASE("sim backend: sequential experts are one GEMM per expert, each with its launch",
          "[sim_backend][moe]") {
  // Megatron's SequentialMLP (SimulatedKernels::moe_grouped_gemm false): experts of 130, 40 and 700 tokens, their
  // forward GEMMs and their weight gradients (beta 1 into fp32) one by one.
  SimOptions o;
  o.kernels.moe_grouped_gemm = false;
  const auto made = one_gpu("dgx-h100", o);
  SimBackend& b = made->backend(0);
  const std::int64_t C = 1024, F = 2816;
  std::vector<Tensor> x, w, y, dy, dw;
  for (std::int64_t rows : {130, 40, 700}) {
    x.push_back(b.empty(Shape{rows, C}, DType::bf16));
    w.push_back(b.empty(Shape{C, F}, DType::bf16));
    y.push_back(b.empty(Shape{rows, F}, DType::bf16));
    dy.push_back(b.empty(Shape{rows, F}, DType::bf16));
    dw.push_back(b.empty(Shape{C, F}));
  }
  b.grouped_gemm(x, w, y, GemmOp{});
  b.grouped_gemm(x, dy, dw, GemmOp{true, false, 1.f, 1.f});
  auto r = made->run();
  REQUIRE(r.ok());
  CHECK(r->tasks == 6);
  const sim::CostModel& cost = made->cost_model();
  double want = 0;
  for (std::int64_t rows : {130, 40, 700})
    want += seconds(cost.gemm(rows, F, C, sim::DType::kBf16)) +
            seconds(cost.gemm(C, F, rows, sim::DType::kBf16, 1, sim::GemmOutput{4, true}));
  CHECK(r->ranks[0].compute_s == Approx(want));
  // More than the one grouped kernel each: three launches and three partial waves.
  CHECK(want > seconds(cost.grouped_gemm({130, 40, 700}, F, C, sim::DType::kBf16)) +
                   seconds(cost.grouped_gemm_wgrad({130, 40, 700}, C, F, sim::DType::kBf16, sim::GemmOutput{4, true})));
}

TEST_CASE("sim backend: Megatron's unfused cross-entropy is eight passes over the logits, 52 bytes each in bf16",
          "[sim_backend][loss]") {
  // One micro-batch's loss over (4096, 32768) bf16 logits, forward and backward, fused and unfused.
  const std::int64_t rows = 4096, vocab = 32768;
  const double logits = static_cast<double>(rows) * vocab;
  // The loss's compute seconds and tasks on one H100, and the cost model's constants.
  struct Loss {
    double seconds;
    std::size_t tasks;
    sim::CostConstants k;
  };
  auto loss = [&](CrossEntropyImpl impl, DType logits_dtype) {
    SimOptions o;
    o.kernels.cross_entropy = impl;
    const auto made = one_gpu("dgx-h100", o);
    SimBackend& b = made->backend(0);
    Tensor x = b.empty(Shape{rows, vocab}, logits_dtype), dx = b.empty(Shape{rows, vocab}, logits_dtype);
    Tensor targets = b.empty(Shape{rows}, DType::i32), row_max = b.empty(Shape{rows}), sumexp = b.empty(Shape{rows});
    Tensor target_logit = b.empty(Shape{rows});
    b.cross_entropy_max(x, row_max);
    b.cross_entropy_partials(x, targets, row_max, 0, sumexp, target_logit);
    b.cross_entropy_backward(x, targets, row_max, sumexp, 0, 1.f, dx);
    auto r = made->run();
    REQUIRE(r.ok());
    return Loss{r->ranks[0].compute_s, static_cast<std::size_t>(r->tasks), made->cost_model().constants()};
  };
  const Loss unfused = loss(CrossEntropyImpl::unfused, DType::bf16), fused = loss(CrossEntropyImpl::fused, DType::bf16);
  const sim::CostConstants& k = unfused.k;
  // Counted from megatron/core/tensor_parallel/cross_entropy.py (core_r0.8.0), bytes per logit: the fp32
  // copy (read 2, write 4), max (read 4), subtract the max in place (8), exp in place (8), sum (read 4),
  // normalize in place (8); backward: scale by the loss gradient in place (8), cast back (read 4, write 2).
  const double per_logit[] = {6, 4, 8, 8, 4, 8, 8, 6};
  double want = 0;
  for (double bytes : per_logit) want += bytes * logits / (3.35e12 * k.memory_efficiency) + seconds(k.kernel_overhead);
  CHECK(unfused.seconds == Approx(want).epsilon(1e-6));
  // fp32 logits need no casts: six passes (4 + 8 + 8 + 4 + 8, then 8).
  const Loss fp32 = loss(CrossEntropyImpl::unfused, DType::f32);
  CHECK(fp32.tasks == 6);
  CHECK(fp32.seconds == Approx(40 * logits / (3.35e12 * k.memory_efficiency) + 6 * seconds(k.kernel_overhead)).epsilon(1e-6));
  // The fused kernels read the bf16 logits three times and write the gradient once: 8 bytes per logit.
  CHECK(fused.seconds == Approx(8 * logits / (3.35e12 * k.memory_efficiency) + 3 * seconds(k.kernel_overhead)).epsilon(1e-3));
}
