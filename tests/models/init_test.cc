// Parameter initialisation: the cpu backend's vectorized normal draws give
// exactly normal_at's fp32 values (the values every earlier version drew, and
// that checkpoints and tests depend on), whatever the thread count, and the
// counter layout of a shard (shard_draws) is full_index's.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels/normal.h"
#include "models/init.h"
#include "models/parameter_store.h"
#include "models/parameters.h"

using namespace meshtrain;

namespace {

ModelSpec tiny() { return *model_preset("tiny"); }

// GQA, SwiGLU (two segments), rope, untied head with a vocabulary no tp divides, experts.
ModelSpec odd_model(bool moe) {
  ModelSpec m = tiny();
  m.name = moe ? "odd-moe" : "odd";
  m.norm = NormKind::rmsnorm;
  m.activation = Activation::swiglu;
  m.position = PositionKind::rope;
  m.kv_heads = 2;
  m.ffn = 96;
  m.vocab = 250;
  m.tied_embeddings = false;
  if (moe) m.experts = 4, m.top_k = 2;
  return m;
}

// The counter each local element of the shard draws per `op` (-1: none, so 0).
std::vector<std::int64_t> counters_of(const NormalInitOp& op, std::int64_t numel) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(numel), -1);
  for (std::int64_t r = 0; r < numel / op.cols; ++r)
    for (const auto& run : op.runs)
      for (std::int64_t j = 0; j < run.width; ++j)
        out[static_cast<std::size_t>(r * op.cols + run.col + j)] =
            static_cast<std::int64_t>(run.counter + static_cast<std::uint64_t>(r) * op.row_stride) + j;
  return out;
}

}  // namespace

TEST_CASE("shard_draws gives every element of a shard its full_index counter", "[init]") {
  for (const ModelSpec& m : {tiny(), odd_model(false), odd_model(true)})
    for (int tp : {1, 2, 4})
      for (int ep : {1, 2})
        for (int etp : {0, 1}) {  // experts split as tp, or whole (expert tensor parallelism 1)
          if ((ep > 1 || etp > 0) && !m.moe()) continue;
          for (const ParamInfo& p : parameter_table(m))
            for (int tr = 0; tr < tp; ++tr)
              for (int er = 0; er < ep; ++er) {
                const ShardCoord c{tr, tp, er, ep, 0, etp};
                INFO(m.name << " " << p.name << " tp " << tr << "/" << tp << " ep " << er << "/" << ep << " etp "
                            << etp);
                std::int64_t numel = 1;
                for (auto d : shard_shape(m, p, c)) numel *= d;
                const NormalInitOp op = shard_draws(m, p, c);
                REQUIRE(op.cols > 0);
                REQUIRE(numel % op.cols == 0);
                std::vector<std::int64_t> want(static_cast<std::size_t>(numel));
                for (std::int64_t i = 0; i < numel; ++i) want[static_cast<std::size_t>(i)] = full_index(m, p, c, i);
                REQUIRE(counters_of(op, numel) == want);
              }
        }
}

TEST_CASE("the polynomial log and cos stay far inside the margin the draws assume", "[init]") {
  // normal.h allows 2^-40 (9e-13) relative for log and absolute for cos.
  double log_err = 0, cos_err = 0;
  for (std::uint64_t i = 0; i < 2'000'000; ++i) {
    const std::uint64_t h = mix64(i);
    const double u = (static_cast<double>(h >> 11) + 1.0) * 0x1.0p-53;
    const double l = std::log(u);
    if (l != 0) log_err = std::max(log_err, std::fabs(cpu::normal_detail::log_poly(u) - l) / std::fabs(l));
    const double x = 6.283185307179586 * (static_cast<double>(mix64(h) >> 11) * 0x1.0p-53);
    cos_err = std::max(cos_err, std::fabs(cpu::normal_detail::cos_poly(x) - std::cos(x)));
  }
  CHECK(cpu::normal_detail::log_poly(1.0) == 0.0);
  CHECK(log_err < 1e-14);
  CHECK(cos_err < 1e-14);
  WARN("largest error: log " << log_err << " (relative), cos " << cos_err << " (absolute)");
}

TEST_CASE("normal_fill gives normal_at's fp32 values bit for bit, the unsure ones included", "[init]") {
  const std::int64_t n = 1'500'000;
  std::vector<float> fast(static_cast<std::size_t>(n));
  std::int64_t unsure = 0;
  for (double stddev : {0.02, 0.02 / std::sqrt(24.0), 1.0}) {
    const std::uint64_t key = mix64(1234) ^ hash_name("layers.0.mlp.up.weight");
    const std::uint64_t first = 977;  // a counter range that starts off a block boundary
    unsure += cpu::normal_fill(key, first, n, stddev, fast.data());
    std::vector<float> ref(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      ref[static_cast<std::size_t>(i)] = static_cast<float>(stddev * normal_at(key, first + static_cast<std::uint64_t>(i)));
    INFO("stddev " << stddev);
    REQUIRE(std::memcmp(fast.data(), ref.data(), fast.size() * sizeof(float)) == 0);
  }
  // About one element in 30 000 takes the libm path; those must agree too.
  CHECK(unsure > 10);
}

TEST_CASE("ParameterStore::initialize draws the same bits at any thread count and tp split", "[init]") {
  const ModelSpec m = odd_model(false);
  for (int tp : {1, 2})
    for (int threads : {1, 3}) {
      INFO("tp " << tp << ", threads " << threads);
      CpuBackend b(CpuBackendOptions{threads});
      const ShardCoord c{tp - 1, tp, 0, 1};
      std::vector<ParamInfo> infos = parameter_table(m);
      ParameterStore store(b, m, infos, c);
      store.initialize(42);
      for (const ParamSlot& s : store.slots()) {
        INFO(s.info.name);
        std::vector<float> got(static_cast<std::size_t>(s.numel)), want(got.size());
        REQUIRE(b.read(s.value, got).ok());
        // The element-by-element definition (ParameterStore::initialize before the backend drew it).
        const bool bias = s.info.name.ends_with(".bias"), norm = s.info.name.find("norm") != std::string::npos;
        const bool residual = s.info.name.ends_with("attn.out.weight") || s.info.name.ends_with("mlp.down.weight");
        const double stddev = residual ? 0.02 / std::sqrt(2.0 * m.layers) : 0.02;
        const std::uint64_t key = mix64(42) ^ hash_name(s.info.name);
        for (std::int64_t i = 0; i < s.numel; ++i) {
          const std::int64_t f = full_index(m, s.info, c, i);
          want[static_cast<std::size_t>(i)] =
              bias ? 0.f : norm ? 1.f : f < 0 ? 0.f : static_cast<float>(stddev * normal_at(key, static_cast<std::uint64_t>(f)));
        }
        REQUIRE(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
      }
    }
}
