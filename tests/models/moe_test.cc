// Mixture of experts on one rank: parameter counts of the presets against an
// independent count and the published totals, the model fields and their
// refusals, the dispatch plans (drop order, send and receive order), the
// routing model of the sim, and the whole model's gradient (auxiliary and
// z-losses included, with capacity drops) against finite differences.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_backend.h"
#include "models/model_chunk.h"
#include "models/moe_dispatch.h"
#include "models/moe_routing.h"
#include "models/parameters.h"
#include "tests/models/directional_derivatives.h"
#include "tests/models/model_specs.h"

using namespace meshtrain;

namespace {

using testing::preset;

// The parameter count written out from the architecture, not from the
// blocks' tables: attention, norms, the dense or MoE MLP per layer, the
// embeddings and the head. Total and active (top_k experts per MoE layer).
struct Count {
  double total = 0, active = 0;
};
Count independent_count(const ModelSpec& m) {
  const double C = m.hidden, H = m.heads, G = m.kv_heads, D = m.head_dim(), F = m.ffn, E = m.experts;
  const double bias = m.bias ? 1 : 0, glu = m.activation == Activation::swiglu ? 2 : 1;
  const double norm = m.norm == NormKind::layernorm ? 2 * C : C;
  Count c;
  const double attention = C * (H + 2 * G) * D + H * D * C + bias * ((H + 2 * G) * D + C);
  for (int l = 0; l < m.layers; ++l) {
    double shared = attention + 2 * norm;
    if (m.moe_layer(l)) {
      const double expert = C * glu * F + F * C;
      const double S = F * m.shared_experts;
      shared += C * E + (S > 0 ? C * glu * S + S * C + bias * (glu * S + C) : 0);
      c.total += shared + E * expert;
      c.active += shared + m.top_k * expert;
    } else {
      const double Fd = m.dense_mlp_width();
      const double mlp = C * glu * Fd + Fd * C + bias * (glu * Fd + C);
      c.total += shared + mlp;
      c.active += shared + mlp;
    }
  }
  double ends = m.vocab * C + norm + (m.tied_embeddings ? 0 : m.vocab * C);
  if (m.position == PositionKind::learned) ends += m.seq_len * C;
  c.total += ends, c.active += ends;
  return c;
}

}  // namespace

TEST_CASE("MoE presets: parameter counts match an independent count and the published totals", "[model][moe]") {
  struct Row {
    const char* name;
    double total, active;  // published, billions (0: none published)
    double tolerance;
  };
  // Mixtral (Jiang et al. 2024): 46.7B total, 12.9B active; 8x22B (Mistral's
  // announcement): 141B, 39B; Qwen3-30B-A3B (Qwen3 report, Table 2): 30.5B,
  // 3.3B (ours lacks the q/k norms' 12,288 parameters).
  for (Row r : {Row{"mixtral-8x7b", 46.7, 12.9, 0.002}, Row{"mixtral-8x22b", 141, 39, 0.005},
                Row{"qwen3-30b-a3b", 30.5, 3.3, 0.02}, Row{"moe-seed", 0, 0, 0}, Row{"tiny-moe", 0, 0, 0}}) {
    INFO(r.name);
    const ModelSpec m = preset(r.name);
    const ParamCount c = count_parameters(m);
    const Count ref = independent_count(m);
    CHECK(static_cast<double>(c.total) == Approx(ref.total).epsilon(1e-12));
    CHECK(static_cast<double>(c.active) == Approx(ref.active).epsilon(1e-12));
    if (r.total > 0) {
      CHECK(static_cast<double>(c.total) / 1e9 == Approx(r.total).epsilon(r.tolerance));
      CHECK(static_cast<double>(c.active) / 1e9 == Approx(r.active).epsilon(r.tolerance));
    }
  }
  // Mixtral 8x7B exactly: 32 layers of attention 4096·6144 + 4096·4096, two norms, a
  // router 4096·8 and 8 experts of 3·4096·14336; embedding, head and final norm.
  const std::int64_t layer = 4096LL * 6144 + 4096LL * 4096 + 2 * 4096 + 4096 * 8 + 8 * 3LL * 4096 * 14336;
  CHECK(count_parameters(preset("mixtral-8x7b")).total == 32 * layer + 2 * 32000LL * 4096 + 4096);
  // moe-seed, the mission's example: 8 experts of d_model 2048.
  const ModelSpec seed = preset("moe-seed");
  CHECK(seed.experts == 8);
  CHECK(seed.hidden == 2048);
  // tiny-moe's active MLP (2 of 8 experts of 128) is tiny's dense 256: equal active parameters but the routers.
  const ParamCount tiny = count_parameters(preset("tiny")), tiny_moe = count_parameters(preset("tiny-moe"));
  CHECK(tiny_moe.active - tiny.total == 4 * (64 * 8 - (256 + 64)));  // routers in, the dense MLP biases out
}

TEST_CASE("MoE model fields: layer rule, JSON round trip and refusals naming the numbers", "[model][moe]") {
  ModelSpec m = preset("tiny-moe");
  m.layers = 6, m.dense_layers = 1, m.moe_every = 2;
  std::vector<int> moe;
  for (int l = 0; l < m.layers; ++l)
    if (m.moe_layer(l)) moe.push_back(l);
  CHECK(moe == std::vector<int>{2, 4});  // l >= dense_layers and l % moe_every == 0 (DeepSeek's rule)
  m.shared_experts = 2, m.capacity_factor = 1.25f, m.renormalize = false, m.z_loss_coeff = 1e-3f, m.dense_ffn = 192;
  auto back = model_from_json(model_to_json(m));
  REQUIRE(back.ok());
  CHECK(model_to_json(*back) == model_to_json(m));
  CHECK(back->capacity_factor == 1.25f);
  CHECK_FALSE(back->renormalize);

  nlohmann::json j = model_to_json(preset("tiny-moe"));
  auto refused = [&](nlohmann::json k) {
    auto r = model_from_json(k);
    REQUIRE_FALSE(r.ok());
    return r.error().message();
  };
  nlohmann::json k = j;
  k["capacity_factor"] = -0.5;
  CHECK_THAT(refused(k), Catch::Contains("'capacity_factor' is negative (-0.5); it must be a number in [0, 1000000]"));
  k = j;
  k["top_k"] = 9;
  CHECK_THAT(refused(k), Catch::Contains("top_k must be in 1..experts (8), got 9"));
  k = j;
  k.erase("experts"), k.erase("top_k");
  k["shared_experts"] = 1;
  CHECK_THAT(refused(k), Catch::Contains("'shared_experts' given without experts"));
  k = j;
  k["dense_layers"] = 4;
  CHECK_THAT(refused(k), Catch::Contains("dense_layers 4 must be in 0..3"));
}

TEST_CASE("capacity drops the later assignments of an expert, in token then slot order", "[model][moe][dispatch]") {
  // 4 tokens, top 2 of 4 experts; capacity ceil(1.0 · 4·2/4) = 2.
  const std::vector<std::int32_t> experts = {0, 1, 0, 2, 0, 1, 3, 0};
  CHECK(expert_capacity(1.0f, 4, 2, 4) == 2);
  CHECK(expert_capacity(0.f, 4, 2, 4) == 0);
  CHECK(expert_capacity(1.25f, 4096, 2, 8) == 1280);
  const RoutingSummary r = summarize_routing(experts, 4, 2);
  CHECK(r.routed == std::vector<std::int64_t>{4, 2, 1, 1});
  // Expert 0 takes tokens 0 and 1; token 2's and token 3's second slot are dropped.
  CHECK(r.kept == std::vector<bool>{true, true, true, true, false, true, true, false});
  CHECK(r.dropped == 2);
  // Sent in (expert, token, slot) order to 2 EP ranks holding experts {0, 1} and {2, 3}.
  const SendPlan s = plan_send(experts, r, 2, 4, 2, 0, 4);
  CHECK(s.expert_rows == std::vector<std::int32_t>{2, 2, 1, 1});
  CHECK(s.peer_rows == std::vector<std::int64_t>{4, 2});
  CHECK(s.send_index == std::vector<std::int32_t>{0, 1, 0, 2, 1, 3});
  CHECK(s.slot_index == std::vector<std::int32_t>{0, 2, 1, 4, -1, 3, 5, -1});
  // Rows 2..3 only (a tp rank's share under etp 1): indices relative to the first.
  const SendPlan half = plan_send(experts, r, 2, 4, 2, 2, 2);
  CHECK(half.send_index == std::vector<std::int32_t>{0, 1});
  CHECK(half.slot_index == std::vector<std::int32_t>{-1, 0, 1, -1});
}

TEST_CASE("received rows are regrouped by local expert, then peer, and back", "[model][moe][dispatch]") {
  // 2 peers, 2 local experts: peer 0 sends 1 and 2 rows, peer 1 sends 3 and 0.
  const ReceivePlan r = plan_receive({1, 2, 3, 0}, 2);
  CHECK(r.peer_rows == std::vector<std::int64_t>{3, 3});
  CHECK(r.expert_rows == std::vector<std::int64_t>{4, 2});
  CHECK(r.block_rows == 6);
  // Received: [p0e0, p0e1, p0e1, p1e0, p1e0, p1e0]; grouped: e0 (p0, p1 ×3), e1 (p0 ×2).
  CHECK(r.group_index == std::vector<std::int32_t>{0, 3, 4, 5, 1, 2});
  for (std::size_t g = 0; g < r.group_index.size(); ++g)
    CHECK(r.ungroup_index[static_cast<std::size_t>(r.group_index[g])] == static_cast<std::int32_t>(g));
  // Expert tensor parallelism 2: etp rank 1 received 1 row from p0 (e1) and 1 from p1 (e0); blocks of 6 rows
  // (rank 0's size), rank 1's padded with 4. Grouped: e0 (t0: p0, p1 ×3; t1: p1), e1 (t0: p0 ×2; t1: p0).
  const ReceivePlan t = plan_receive({1, 2, 3, 0, 0, 1, 1, 0}, 2, 2, 1);
  CHECK(t.peer_rows == std::vector<std::int64_t>{1, 1});
  CHECK(t.block_rows == 6);
  CHECK(t.expert_rows == std::vector<std::int64_t>{5, 3});
  CHECK(t.group_index == std::vector<std::int32_t>{0, 3, 4, 5, 7, 1, 2, 6});
  CHECK(t.ungroup_index == std::vector<std::int32_t>{0, 5, 6, 1, 2, 3, 7, 4, -1, -1, -1, -1});
  // The counts alone, as a modelled dispatch takes them: the same figures, no index maps.
  const ReceivePlan c = receive_counts({1, 2, 3, 0, 0, 1, 1, 0}, 2, 2, 1);
  CHECK(c.peer_rows == t.peer_rows);
  CHECK(c.block_rows == t.block_rows);
  CHECK(c.expert_rows == t.expert_rows);
  CHECK(c.group_index.empty());
  CHECK(c.ungroup_index.empty());
}

TEST_CASE("the routing model: uniform, zipf and files, and the busiest EP rank's plan", "[model][moe][routing]") {
  auto uniform = MoeRouting::parse("uniform");
  REQUIRE(uniform.ok());
  CHECK(uniform->shares(0, 4, 1) == std::vector<double>{0.25, 0.25, 0.25, 0.25});
  auto zipf = MoeRouting::parse("zipf:1");
  REQUIRE(zipf.ok());
  const std::vector<double> z = zipf->shares(0, 4, 1);
  CHECK(z[0] == Approx(1.0 / (1 + 0.5 + 1.0 / 3 + 0.25)));
  CHECK(z[3] == Approx(0.25 / (1 + 0.5 + 1.0 / 3 + 0.25)));
  const std::string path = "moe_routing_test.json";
  {
    std::ofstream f(path);
    f << "[[3, 1, 0, 0], [1, 1, 1, 1]]";
  }
  auto file = MoeRouting::parse("file:" + path);
  REQUIRE(file.ok());
  CHECK(file->check(4, 2).ok());
  CHECK_THAT(file->check(8, 2).error().message(), Catch::Contains("holds 4 shares, the model has 8 experts"));
  CHECK_THAT(file->check(4, 3).error().message(), Catch::Contains("2 lists of shares, the model has 3 MoE layers"));
  CHECK(file->shares(0, 4, 1) == std::vector<double>{0.75, 0.25, 0, 0});
  // Top-2: a token picks two distinct experts, so no expert takes more than half; the excess goes to the others.
  CHECK(file->shares(0, 4, 2) == std::vector<double>{0.5, 0.5, 0, 0});
  CHECK(file->shares(1, 4, 2) == std::vector<double>{0.25, 0.25, 0.25, 0.25});
  std::remove(path.c_str());
  CHECK_THAT(MoeRouting::parse("zipf:-1").error().message(), Catch::Contains("non-negative exponent"));
  CHECK_THAT(MoeRouting::parse("skewed").error().message(), Catch::Contains("uniform, zipf:S"));

  // 64 tokens, top 2, 4 experts over 2 EP ranks, shares 3:1:0:0: rank 0 is
  // the busiest; every peer sends it 96 and 32 rows; capacity 40 drops 56.
  const ModelledDispatch d = modelled_dispatch(file->shares(0, 4, 1), 64, 64, 2, 2, 0);
  CHECK(d.busiest_rank == 0);
  CHECK(d.routing.routed == std::vector<std::int64_t>{96, 32, 0, 0});
  CHECK(d.send.peer_rows == std::vector<std::int64_t>{128, 0});
  CHECK(d.receive.expert_rows == std::vector<std::int64_t>{192, 64});
  const ModelledDispatch capped = modelled_dispatch(file->shares(0, 4, 1), 64, 64, 2, 2, 40);
  CHECK(capped.routing.dropped == 56 + 0);
  CHECK(capped.receive.expert_rows == std::vector<std::int64_t>{80, 64});
  // Counts only: simulating 16M tokens of qwen3-30b-a3b built maps of 134M rows per MoE layer and
  // micro-batch, minutes of host work before the out-of-memory answer.
  const ModelledDispatch big = modelled_dispatch(MoeRouting::uniform().shares(0, 128, 8), 1 << 24, 1 << 24, 8, 8, 0);
  CHECK(big.send.peer_rows == std::vector<std::int64_t>(8, (std::int64_t{1} << 24) * 8 / 8));
  CHECK(big.send.send_index.empty());
  CHECK(big.send.slot_index.empty());
  CHECK(big.receive.group_index.empty());
  CHECK(big.receive.ungroup_index.empty());
}

namespace {

// The whole model on one rank; the objective is what backward differentiates:
// the mean token loss plus the MoE layers' balance and z terms of this one
// micro-batch (weight 1: it is the whole batch).
double objective(testing::TokenModel& f) {
  f.chunk.moe_statistics().clear(f.b);
  const double loss = f.loss();
  float terms[2] = {0, 0};
  REQUIRE(f.b.read(f.chunk.moe_statistics().losses, terms).ok());
  return loss + f.m.aux_loss_coeff * terms[0] + f.m.z_loss_coeff * terms[1];
}

// The directional derivatives (tests/models/directional_derivatives.h) of
// the objective, auxiliary and z-losses included. Top-k is piecewise
// constant: at initialisation (router logits ~ N(0, 0.16)) a step that moves
// the loss by 1e-3 changes some tokens' experts, so the routers start 40
// times larger, which spreads the logits so far apart that no step here
// changes a token's experts.
void check_gradient(const ModelSpec& spec) {
  const std::uint64_t seed = 11;
  INFO("model " << spec.name << ", seed " << seed);
  testing::TokenModel f(spec, seed, 2, 16);
  std::vector<float> theta(static_cast<std::size_t>(f.chunk.parameters().numel()));
  REQUIRE(f.b.read(f.chunk.parameters().values(), theta).ok());
  for (const ParamSlot& slot : f.chunk.parameters().slots())
    if (slot.info.name.ends_with("moe.router"))
      for (std::int64_t i = 0; i < slot.numel; ++i) theta[static_cast<std::size_t>(slot.offset + i)] *= 40.f;
  f.b.write(f.chunk.parameters().values(), theta);
  testing::check_directional_derivatives(f.b, f.chunk.parameters(), f.gradient(), [&] { return objective(f); },
                                         testing::DirectionalCheck{2e-3, false, true});
}

}  // namespace

TEST_CASE("MoE gradients, auxiliary and z-losses included, match finite differences", "[model][moe]") {
  ModelSpec gelu = preset("tiny-moe");
  gelu.layers = 2, gelu.seq_len = 16, gelu.aux_loss_coeff = 0.5f, gelu.z_loss_coeff = 0.05f;
  check_gradient(gelu);
  // SwiGLU experts without renormalisation, a shared expert, and a capacity that drops.
  ModelSpec glu = gelu;
  glu.name = "tiny-moe-swiglu";
  glu.activation = Activation::swiglu, glu.norm = NormKind::rmsnorm, glu.bias = false;
  glu.renormalize = false, glu.shared_experts = 1, glu.capacity_factor = 1.0f;
  check_gradient(glu);
}
