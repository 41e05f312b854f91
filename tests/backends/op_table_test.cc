// The op table (backends/op_table.h): every op has a cost and a sample that
// every backend runs (and that calls its own op, seen through BackendWrapper's
// hook), and the sim backend charges what the table counts,
// checked against FLOP and byte counts derived here by hand.
#include "backends/op_table.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <vector>

#include "backends/backend_wrapper.h"
#include "backends/cpu/comm/in_process.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_factory.h"
#include "backends/sim/sim_backend.h"
#include "tests/skip.h"

using namespace meshtrain;

namespace {

std::unique_ptr<SimCluster> sim_cluster(int world = 2) {
  auto spec = sim::cluster_preset("dgx-a100");
  REQUIRE(spec.ok());
  auto c = SimCluster::create(*spec, world, {0});  // rank 0 simulated, its peers analytic
  REQUIRE(c.ok());
  return std::move(c).value();
}

// Hands every op's sample of 4 x 8 fp32 values on `b` to check(op, sample),
// under the op's name; a sample that cannot be built fails the test.
template <class F>
void for_each_sample(Backend& b, F&& check) {
  for (const OpInfo& op : op_table()) {
    INFO(op.name);
    auto sample = op.sample(b, SampleShape{4, 8, DType::f32});
    REQUIRE(sample.ok());
    check(op, *sample);
  }
}

// Runs every sample of class other than p2p on `b` (point to point needs two ranks: below); returns the
// ops whose sample or run failed, with why.
std::vector<std::string> run_samples(Backend& b, bool p2p) {
  std::vector<std::string> failed;
  for (const OpInfo& op : op_table()) {
    if ((op.cls == CostClass::p2p) != p2p) continue;
    auto sample = op.sample(b, SampleShape{4, 8, DType::f32});
    if (!sample) {
      failed.push_back(std::string(op.name) + ": " + sample.error().message());
      continue;
    }
    sample->run();
    if (Status s = b.synchronize(); !s) failed.push_back(std::string(op.name) + ": " + s.error().message());
  }
  return failed;
}

// Records the table entries BackendWrapper's hook sees.
class Seen final : public BackendWrapper {
 public:
  using BackendWrapper::BackendWrapper;
  std::vector<std::string_view> ops;

 private:
  void on_op(const OpInfo& op, const OpArgs& args, const Call& call) override {
    (void)args;
    ops.push_back(op.name);
    call();
  }
};

}  // namespace

TEST_CASE("op table: each compute op's sample calls its op, and BackendWrapper's hook sees it", "[op_table]") {
  auto cluster = sim_cluster();
  for (const OpInfo& op : op_table()) {
    if (op.cls == CostClass::collective || op.cls == CostClass::p2p) continue;  // forwarded without the hook
    INFO(op.name);
    Seen seen(cluster->backend(0));
    auto sample = op.sample(seen, SampleShape{4, 8, DType::f32});
    REQUIRE(sample.ok());
    seen.ops.clear();  // the operands' fills
    sample->run();
    // grouped_gemm reaches wrappers as one gemm per group (Backend's default); host_adamw is foreach_adamw.
    const std::string_view expected = op.name == "grouped_gemm" ? "gemm" : op.method.empty() ? op.name : op.method;
    REQUIRE(!seen.ops.empty());
    CHECK(seen.ops.front() == expected);
    CHECK(std::all_of(seen.ops.begin(), seen.ops.end(), [&](std::string_view s) { return s == expected; }));
  }
}

TEST_CASE("op table: every op is named, described and costed, once", "[op_table]") {
  std::set<std::string_view> names;
  for (const OpInfo& op : op_table()) {
    INFO(op.name);
    CHECK(names.insert(op.name).second);
    CHECK(!op.cost_name.empty());
    CHECK(!op.operands.empty());
    CHECK(op.sample != nullptr);
    CHECK(find_op(op.name) == &op);
    // An op costs by its traffic (memory-bound and host ops) or by a function of its own (the
    // other classes, and a memory-bound op whose bytes are not its operands' own: fp8_cast).
    if (measured_per_op(op.cls))
      CHECK((!op.traffic.empty() || op.cost != nullptr));
    else
      CHECK(op.cost != nullptr);
  }
  CHECK(find_op("no_such_op") == nullptr);
  // Backend ops the table must hold (a sample of the groups of backend.h).
  for (std::string_view name :
       {"fill", "gemm", "grouped_gemm", "embedding_backward", "moe_combine_backward", "rmsnorm_backward",
        "swiglu_backward", "rope", "attention_backward", "attention_merge", "cross_entropy_accuracy", "foreach_adamw",
        "sign_decompress", "all_to_all", "send_recv", "barrier"})
    CHECK(find_op(name) != nullptr);
}

TEST_CASE("op table: every sample costs positive FLOPs or bytes of its op's class", "[op_table]") {
  auto cluster = sim_cluster();
  for_each_sample(cluster->backend(0), [](const OpInfo& op, OpSample& sample) {
    CHECK(sample.cost.cls == op.cls);
    CHECK((sample.cost.flops > 0 || sample.cost.bytes > 0));
    if (op.cls == CostClass::gemm || op.cls == CostClass::attention) CHECK(sample.cost.flops > 0);
  });
}

TEST_CASE("op table: the cpu backend runs every op's sample", "[op_table]") {
  CpuBackend b(CpuBackendOptions{1});
  CHECK(run_samples(b, false) == std::vector<std::string>{});
  // Point to point: ranks 0 and 1 as threads, each running its side of every sample.
  std::vector<std::string> failed[2];
  const Status s = run_ranks(2, [&](int rank, Communicator& comm) -> Status {
    CpuBackend be(comm, CpuBackendOptions{1});
    failed[rank] = run_samples(be, true);
    return ok_status();
  });
  CHECK(s.ok());
  CHECK(failed[0] == std::vector<std::string>{});
  CHECK(failed[1] == std::vector<std::string>{});
  // One rank has no partner: the sample says so instead of sending to itself.
  auto lone = op_info("send").sample(b, SampleShape{});
  REQUIRE(!lone.ok());
  CHECK_THAT(lone.error().message(), Catch::Contains("needs a world of two"));
}

TEST_CASE("op table: the sim backend runs every op's sample and times its compute", "[op_table]") {
  auto cluster = sim_cluster();
  SimBackend& b = cluster->backend(0);
  for_each_sample(b, [&](const OpInfo& op, OpSample& sample) {
    const double before = b.compute_seconds();
    sample.run();
    if (op.cls == CostClass::memory || op.cls == CostClass::gemm || op.cls == CostClass::attention)
      CHECK(b.compute_seconds() > before);
  });
  REQUIRE(b.synchronize().ok());
}

TEST_CASE("op table: the cuda backend runs every op's sample", "[op_table][gpu]") {
  if (!cuda_backend_built())
    MT_SKIP_MISSING("the cuda backend (this build has no CUDA Toolkit)", "nvidia-cuda-toolkit");
  if (cuda_device_name().empty()) MT_SKIP_MISSING("a CUDA device", "nvidia-driver");
  auto b = make_cuda_backend(CudaBackendOptions{});
  REQUIRE(b.ok());
  CHECK(run_samples(**b, false) == std::vector<std::string>{});
}

TEST_CASE("op table: the sim charges the table's bytes, derived here by hand", "[op_table]") {
  auto cluster = sim_cluster(1);
  SimBackend& b = cluster->backend(0);
  const sim::CostModel& cost = cluster->cost_model();
  // The seconds of the one task an op adds, against a memory-bound task of `bytes` under `name`.
  auto charged = [&](auto&& issue, double bytes, std::string_view name) {
    const double before = b.compute_seconds();
    issue();
    CHECK(b.compute_seconds() - before == static_cast<double>(cost.memory_bound(bytes, name)) / 1e12);
  };
  SECTION("layernorm_forward reads x, weight, bias and writes out, mean, rstd") {
    Tensor x = b.empty({10, 6}), w = b.empty({6}), out = b.empty({10, 6}), mean = b.empty({10}), rstd = b.empty({10});
    const double bytes = 4.0 * (60 + 6 + 6 + 60 + 10 + 10);
    CHECK(op_cost(op_info("layernorm_forward"), {&x, &w, &w, &out, &mean, &rstd}).bytes == bytes);
    charged([&] { b.layernorm_forward(x, w, w, out, mean, rstd, 1e-5f); }, bytes, "layernorm_forward");
  }
  SECTION("adamw reads param, grad, m, v, coef and writes param, m, v; foreach_adamw sums its tensors") {
    Tensor p = b.empty({100}), g = b.empty({100}), m = b.empty({100}), v = b.empty({100}), coef = b.empty({1});
    charged([&] { b.adamw(p, g, m, v, coef, AdamWOp{}); }, 4.0 * (7 * 100 + 1), "adamw");
    Tensor p2 = b.empty({20}), g2 = b.empty({20}), m2 = b.empty({20}), v2 = b.empty({20});
    const std::vector<AdamWTensors> two = {{p, g, m, v, 0.f}, {p2, g2, m2, v2, 0.f}};
    charged([&] { b.foreach_adamw(two, coef, AdamWOp{}); }, 4.0 * (7 * 120 + 1), "adamw");
  }
  SECTION("an embedding reads one table row per token: its ids and twice its output") {
    Tensor table = b.empty({1000, 16}), ids = b.empty({12}, DType::i32), out = b.empty({12, 16}, DType::bf16);
    charged([&] { b.embedding_forward(table, ids, out, 0); }, 4.0 * 12 + 2.0 * 2 * 12 * 16, "embedding_forward");
  }
  SECTION("rope moves the rotated heads' share of x, in and out") {
    Tensor x = b.empty({1, 4, 3, 8});
    charged([&] { b.rope(x, 3, 2, 1e4f, false, 0); }, 2.0 * 4 * (4 * 3 * 8) * 2 / 3, "rope");
  }
  SECTION("gemm: 2mnk FLOPs over (mk + kn + mn) elements") {
    Tensor a = b.empty({64, 16}), w = b.empty({16, 32}), c = b.empty({64, 32});
    const OpCost g = op_cost(op_info("gemm"), {&a, &w, &c});
    CHECK(g.cls == CostClass::gemm);
    CHECK(g.flops == 2.0 * 64 * 32 * 16);
    CHECK(g.bytes == 4.0 * (64 * 16 + 16 * 32 + 64 * 32));
    const double before = b.compute_seconds();
    b.gemm(a, w, c, GemmOp{});
    CHECK(b.compute_seconds() - before == static_cast<double>(cost.gemm(64, 32, 16, sim::DType::kFp32)) / 1e12);
  }
  SECTION("causal attention: half of 4·B·H·T²·D, backward 2.5×; a query window its share of the scores") {
    AttentionOp op;
    op.heads = op.kv_heads = 4, op.head_dim = 8, op.causal = true;
    Tensor qkv = b.empty({2, 16, 12, 8}), out = b.empty({2, 16, 4, 8}), lse = b.empty({2, 4, 16});
    OpArgs args;
    const Tensor* fwd[] = {&qkv, &out, &lse};
    args.tensors = fwd;
    args.attention = &op;
    const double full = 4.0 * 2 * 4 * 16 * 16 * 8 / 2;
    CHECK(op_cost(op_info("attention_forward"), args).flops == full);
    const Tensor* bwd[] = {&out, &qkv, &out, &lse, &qkv};
    args.tensors = bwd;
    CHECK(op_cost(op_info("attention_backward"), args).flops == 2.5 * full);
    // Rows 8..15 of 16 score keys 0..t: 9 + 10 + ... + 16 = 100 of the 136 causal scores.
    op.query_begin = 8, op.query_rows = 8;
    args.tensors = fwd;
    CHECK(op_cost(op_info("attention_forward"), args).flops == Approx(full * 100.0 / 136.0));
  }
}
