// Context parallelism against the single-rank run: each sequence split over
// cp ranks (chunks r and 2·cp-1-r), keys and values exchanged by all-gather
// or ring, alone and with tensor, sequence, pipeline and data parallelism and
// ZeRO; the GPT model has learned positions, the Llama one RoPE and
// grouped-query attention.
#include <algorithm>
#include <cmath>

#include "tests/parallel/parallel_check.h"

namespace meshtrain::testing {
namespace {

Plan with_cp(Plan p, int cp, ContextComm comm = ContextComm::all_gather) {
  p.cp = cp;
  p.cp_comm = comm;
  return p;
}

TEST_CASE("context parallelism alone matches the single-rank run", "[parallel][cp]") {
  check_matches_reference(tiny_gpt(), with_cp(make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b), 2));
  check_matches_reference(tiny_gpt(), with_cp(make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b), 4));
  check_matches_reference(tiny_llama(), with_cp(make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b), 4));
}

TEST_CASE("ring attention, block by block with merged partial results, matches the single-rank run",
          "[parallel][cp][ring]") {
  // The merge reorders the softmax's sums: the same 1e-5 bound as the all-gather, not its bits.
  check_matches_reference(tiny_gpt(), with_cp(make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b), 4, ContextComm::ring));
  check_matches_reference(tiny_llama(),
                          with_cp(make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b), 2, ContextComm::ring));
}

TEST_CASE("context parallelism with tensor and sequence parallelism matches the single-rank run",
          "[parallel][cp][tp]") {
  check_matches_reference(tiny_llama(), with_cp(make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b), 2));
  Plan sp = with_cp(make_plan(2, 1, 1, 0, ScheduleKind::one_f_one_b), 2);
  sp.sequence_parallel = true;
  check_matches_reference(tiny_gpt(), sp);
}

TEST_CASE("context parallelism with pipeline and data parallelism and ZeRO matches the single-rank run",
          "[parallel][cp][pp]") {
  check_matches_reference(tiny_gpt(), with_cp(make_plan(1, 2, 1, 0, ScheduleKind::one_f_one_b), 2));
  check_matches_reference(tiny_llama(), with_cp(make_plan(1, 2, 1, 1, ScheduleKind::interleaved, 2), 2));
  // Gradients reduce, and ZeRO shards, over the dp·cp ranks that hold the same parameters.
  check_matches_reference(tiny_gpt(), with_cp(make_plan(1, 1, 2, 1, ScheduleKind::one_f_one_b), 2));
  check_matches_reference(tiny_llama(), with_cp(make_plan(1, 1, 2, 3, ScheduleKind::one_f_one_b), 2));
  check_matches_reference(tiny_gpt(), with_cp(make_plan(2, 1, 2, 2, ScheduleKind::one_f_one_b), 2));
}

TEST_CASE("context-parallel plans that do not fit are refused naming the numbers", "[parallel][cp][errors]") {
  Plan p = with_cp(make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b), 3);
  p.seq_len = 18;  // six chunks of 3
  CHECK(validate_plan(p, tiny_gpt()).ok());
  p.seq_len = 15;
  const Status odd = validate_plan(p, tiny_gpt());
  REQUIRE_FALSE(odd.ok());
  CHECK_THAT(odd.error().message(), Catch::Contains("seq_len 15") && Catch::Contains("2·cp = 6 chunks"));
  const Status vision = validate_plan(with_cp(make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b), 2),
                                      *model_preset("vit-tiny"));
  REQUIRE_FALSE(vision.ok());
  CHECK_THAT(vision.error().message(), Catch::Contains("vision model"));
  const Status moe = validate_plan(with_cp(make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b), 2),
                                   *model_preset("tiny-moe"));
  REQUIRE_FALSE(moe.ok());
  CHECK_THAT(moe.error().message(), Catch::Contains("experts"));
}

TEST_CASE("a context rank holds chunks r and 2·cp-1-r of each sequence", "[parallel][cp]") {
  CHECK(context_positions(8, 2, 0) == std::vector<std::int32_t>{0, 1, 6, 7});
  CHECK(context_positions(8, 2, 1) == std::vector<std::int32_t>{2, 3, 4, 5});
  // Every position once over the ranks, and each rank's causal work (Σ (p + 1)) the same.
  for (int cp : {2, 4, 8}) {
    std::vector<int> seen(64, 0);
    std::int64_t work0 = -1;
    for (int r = 0; r < cp; ++r) {
      std::int64_t work = 0;
      for (std::int32_t p : context_positions(64, cp, r)) ++seen[static_cast<std::size_t>(p)], work += p + 1;
      if (work0 < 0) work0 = work;
      CHECK(work == work0);
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  }
}

}  // namespace
}  // namespace meshtrain::testing

namespace meshtrain::testing {
namespace {

// Deterministic values in [-1, 1).
std::vector<float> noise(std::size_t n, std::uint64_t salt) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(static_cast<double>(mix64(kSeed ^ mix64(salt * 1000003u + i)) >> 11) * 0x1.0p-52 - 1.0);
  return v;
}

// Rows `positions` of each sample of a (B, T, X) host tensor.
std::vector<float> rows_at(const std::vector<float>& all, int B, int T, std::int64_t X,
                           const std::vector<std::int32_t>& positions) {
  std::vector<float> out;
  for (int b = 0; b < B; ++b)
    for (std::int32_t p : positions)
      out.insert(out.end(), all.begin() + (static_cast<std::int64_t>(b) * T + p) * X,
                 all.begin() + (static_cast<std::int64_t>(b) * T + p + 1) * X);
  return out;
}

TEST_CASE("context-parallel attention, causal or not, is the whole sequence's attention on each rank's rows",
          "[parallel][cp][attention]") {
  constexpr int B = 2, T = 16, H = 4, G = 2, D = 8, S = H + 2 * G;
  const ModelSpec m = tiny_gpt();
  const std::vector<float> qkv = noise(static_cast<std::size_t>(B) * T * S * D, 1);
  const std::vector<float> dout = noise(static_cast<std::size_t>(B) * T * H * D, 2);
  for (const bool causal : {true, false})
    for (const float theta : {0.f, 10000.f})
      for (const int cp : {2, 4})
        for (const ContextComm comm : {ContextComm::all_gather, ContextComm::ring}) {
          INFO("causal " << causal << ", rope theta " << theta << ", cp " << cp << ", " << context_comm_name(comm));
          Group group{0, {}};
          for (int r = 0; r < cp; ++r) group.ranks.push_back(r);
          AttentionOp op{H, G, D, 1.f / std::sqrt(static_cast<float>(D))};
          op.causal = causal;
          const Status s = run_ranks(cp, [&](int rank, Communicator& c) -> Status {
            CpuBackend b(c, CpuBackendOptions{1});
            // The reference: the whole sequence on this rank, rotated, attended, and rotated back.
            Tensor full = b.empty(Shape{B, T, S, D}), out = b.empty(Shape{B, T, H, D}), lse = b.empty(Shape{B, H, T});
            Tensor dfull = b.empty(Shape{B, T, S, D}), dout_full = b.empty(Shape{B, T, H, D});
            b.write(full, qkv), b.write(dout_full, dout);
            if (theta > 0) b.rope(full, S, H + G, theta, false, 0);
            b.attention_forward(full, out, lse, op);
            b.attention_backward(dout_full, full, out, lse, dfull, op);
            if (theta > 0) b.rope(dfull, S, H + G, theta, true, 0);
            std::vector<float> ref_out(static_cast<std::size_t>(out.numel())), ref_dqkv(static_cast<std::size_t>(dfull.numel()));
            MT_TRY(b.read(out, ref_out));
            MT_TRY(b.read(dfull, ref_dqkv));
            // This rank's share through the exchange.
            ParameterStore params(b, m, {}, ShardCoord{});
            ChunkOptions options;
            options.context = ContextParallel{group, rank, cp, comm};
            BlockContext ctx(b, m, params, TensorParallel{Group{1, {rank}}, 0, 1}, options);
            const std::vector<std::int32_t> pos = context_positions(T, cp, rank);
            const std::int64_t L = T / cp;
            Tensor local = b.empty(Shape{B * L, S * D}), dlocal = b.empty(Shape{B * L, H * D});
            b.write(local, rows_at(qkv, B, T, S * D, pos));
            b.write(dlocal, rows_at(dout, B, T, H * D, pos));
            ContextAttentionSaved saved;
            const Tensor attn = context_attention_forward(ctx, B, L, local, op, theta, saved);
            const Tensor dqkv = context_attention_backward(ctx, B, L, dlocal, op, theta, saved);
            std::vector<float> got_out(static_cast<std::size_t>(attn.numel())), got_dqkv(static_cast<std::size_t>(dqkv.numel()));
            MT_TRY(b.read(attn, got_out));
            MT_TRY(b.read(dqkv, got_dqkv));
            const std::vector<float> want_out = rows_at(ref_out, B, T, H * D, pos);
            const std::vector<float> want_dqkv = rows_at(ref_dqkv, B, T, S * D, pos);
            if (relative_error(got_out, want_out) > 1e-5 || relative_error(got_dqkv, want_dqkv) > 1e-5)
              return make_error("rank {}: output error {}, gradient error {}", rank, relative_error(got_out, want_out),
                                relative_error(got_dqkv, want_dqkv));
            return ok_status();
          });
          INFO((s.ok() ? std::string() : s.error().message()));
          CHECK(s.ok());
        }
}

}  // namespace
}  // namespace meshtrain::testing
