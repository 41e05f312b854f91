#include "models/moe_layer.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "models/block_context.h"
#include "models/moe_dispatch.h"
#include "models/moe_routing.h"

namespace meshtrain {

void add_moe_parameters(ParamTableBuilder& t, const std::string& prefix, int width, int ffn, Activation activation,
                        bool bias, const MoeShape& s) {
  const std::int64_t C = width, F = ffn, E = s.experts;
  const bool glu = activation == Activation::swiglu;
  const std::vector<std::int64_t> up_segments = glu ? std::vector<std::int64_t>{F, F} : std::vector<std::int64_t>{F};
  t.add(prefix + ".router", {C, E}, TpSplit::replicated, 0, {}, true, false);
  t.add(prefix + ".up", {E, C, glu ? 2 * F : F}, TpSplit::column, 1, up_segments, true, true, true);
  t.add(prefix + ".down", {E, F, C}, TpSplit::row, 0, {}, true, true, true);
  if (s.shared_experts == 0) return;
  const std::int64_t S = F * s.shared_experts;
  t.linear(prefix + ".shared.up", C, glu ? 2 * S : S, TpSplit::column, bias,
           glu ? std::vector<std::int64_t>{S, S} : std::vector<std::int64_t>{S});
  t.linear(prefix + ".shared.down", S, C, TpSplit::row, bias);
}

double moe_activation_bytes(double rows, int width, int ffn, Activation activation, const MoeShape& s,
                            double value_bytes, int tp, int etp, bool recompute_act) {
  const double glu = activation == Activation::swiglu ? 2.0 : 1.0, K = s.top_k, E = s.experts;
  // Router: probabilities (fp32), lse and the K weights and expert ids.
  double bytes = 4.0 * rows * (E + 1 + 2 * K);
  // Per assignment: its row grouped for the expert and after it (C each), the
  // expert's up output and activation (F/etp each, twice for SwiGLU's up; the
  // activation not under recompute module moe_act), and the index maps (4 i32).
  const double act = recompute_act ? 0.0 : 1.0;
  bytes += rows * K * (value_bytes * (2.0 * width + (glu + act) * ffn / etp) + 16.0);
  if (s.shared_experts > 0) bytes += value_bytes * rows * (glu + 1.0) * ffn * s.shared_experts / tp;
  return bytes;
}

struct MoeMlp::Saved : Block::Saved {
  Tensor x_in;                          // (R, C) for the shared experts
  Tensor x;                             // (N, C) the routed tokens (gathered under SP)
  bool input_recomputed = false;        // x_in and x made again in backward (release_input)
  Tensor probs, lse, weights, experts;  // (N, E), (N), (N, K), (N, K)
  Tensor send_index, slot_index, group_index, ungroup_index;
  Tensor grouped, up, act;              // (M, C), (M, 2F or F), (M, F)
  Tensor back;                          // (S, C) the experts' outputs in send order
  Tensor shared_up, shared_act;
  std::vector<std::int64_t> routed;     // (E) assignments per expert over the N tokens
  std::vector<std::int64_t> send_rows, recv_rows, expert_rows;
  std::int64_t tokens = 0, rows = 0, first = 0;  // N, D (rows dispatched), first dispatched row
  std::int64_t received = 0, block = 0;          // rows this rank received; rows of an etp block
};

MoeMlp::MoeMlp(BlockContext& ctx, std::string prefix, int width, int ffn, Activation activation, MoeShape shape)
    : ctx_(ctx),
      prefix_(std::move(prefix)),
      width_(width),
      ffn_(ffn / ctx.options.expert.tensor_size),
      activation_(activation),
      s_(shape),
      etp_(ctx.options.expert.tensor_size),
      split_rows_(ctx.tp.size > 1) {}

MoeMlp::~MoeMlp() = default;

Tensor MoeMlp::upload(const std::vector<std::int32_t>& host, Shape shape) {
  Tensor t = ctx_.b.empty(std::move(shape), DType::i32);
  if (!host.empty()) ctx_.b.write(t, host);
  return t;
}

Tensor MoeMlp::exchange(const Tensor& in, const std::vector<std::int64_t>& send,
                        const std::vector<std::int64_t>& recv, Event& done) {
  Backend& b = ctx_.b;
  const ExpertParallel& ep = ctx_.options.expert;
  done = Event{};
  if (ep.size == 1) return in;
  const std::int64_t C = width_;
  std::int64_t rows = 0;
  std::vector<std::int64_t> send_counts, recv_counts;
  for (std::int64_t r : send) send_counts.push_back(r * C);
  for (std::int64_t r : recv) recv_counts.push_back(r * C), rows += r;
  Tensor out = b.empty(Shape{rows, C}, in.dtype());
  const std::optional<Stream>& side = ctx_.options.expert_stream;
  if (!side) {
    b.all_to_all(in.view(Shape{in.numel()}), send_counts, out, recv_counts, ep.group);
    return out;
  }
  b.wait(*side, b.record(b.current_stream()));
  {
    StreamScope on(b, *side);
    b.all_to_all(in.view(Shape{in.numel()}), send_counts, out, recv_counts, ep.group);
  }
  done = b.record(*side);
  return out;
}

void MoeMlp::arrive(const Event& done) {
  if (done.valid()) ctx_.b.wait(ctx_.b.current_stream(), done);
}

Tensor MoeMlp::gather_blocks(const Tensor& rows, std::int64_t block) {
  Backend& b = ctx_.b;
  const std::int64_t C = width_, n = rows.numel() / C;
  Tensor padded = b.empty(Shape{block, C}, rows.dtype());
  if (n < block) b.fill(padded, 0.f);
  if (n > 0) {
    Tensor head = padded.rows(0, n);
    b.copy(rows.view(Shape{n, C}), head);
  }
  Tensor all = b.empty(Shape{block * etp_, C}, rows.dtype());
  b.all_gather(padded, all, ctx_.options.expert.tensor);
  return all;
}

Tensor MoeMlp::scatter_blocks(const Tensor& blocks, std::int64_t received) {
  Backend& b = ctx_.b;
  const std::int64_t C = width_, block = blocks.numel() / C / etp_;
  Tensor mine = b.empty(Shape{block, C}, blocks.dtype());
  b.reduce_scatter(blocks, mine, ctx_.options.expert.tensor, ReduceOp::sum);
  return mine.rows(0, received);
}

Tensor MoeMlp::expert_matrix(const Tensor& all, int e) const {
  const std::int64_t a = all.shape()[1], b = all.shape()[2];
  return all.slice(e * a * b, a * b, Shape{a, b});
}

void MoeMlp::expert_gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op,
                         const std::vector<std::int64_t>& expert_rows) {
  // One group per local expert with rows: its rows of the expert-ordered operands, and its matrix of
  // the (El, ., .) weight (b) or weight gradient (c, when op.trans_a: dW_e += a_eᵀ b_e).
  std::vector<Tensor> as, bs, cs;
  std::int64_t at = 0;
  for (std::size_t e = 0; e < expert_rows.size(); ++e) {
    const std::int64_t n = expert_rows[e];
    if (n == 0) continue;
    as.push_back(a.rows(at, n));
    bs.push_back(op.trans_a ? b.rows(at, n) : expert_matrix(b, static_cast<int>(e)));
    cs.push_back(op.trans_a ? expert_matrix(c, static_cast<int>(e)) : c.rows(at, n));
    at += n;
  }
  if (!as.empty()) ctx_.b.grouped_gemm(as, bs, cs, op);
}

Tensor MoeMlp::fp8_operand(const char* linear, Fp8Operand which, const Tensor& x, Fp8Cast cast, std::int64_t rows) {
  if (ctx_.fp8 == nullptr) return x;
  // Delayed scaling: no rows routed here, no GEMM, so no cast (the weight's included). Current
  // scaling casts anyway: the emulation reduces its amax over the ranks that share the
  // micro-batch (tp and cp), which hold every expert's rows of it and its expert shards among
  // them (where the expert group spans data-parallel ranks, engine/step/fp8_training.h refuses
  // the emulation), a collective every rank joins. TE's grouped linears keep each rank's own
  // amax: the sim issues no reduction, and, as under delayed scaling, no cast of no rows.
  const bool current = ctx_.fp8->recipe() == Fp8Recipe::current;
  if (rows == 0 && !(current && ctx_.b.holds_values())) return x;
  if (!current) return ctx_.fp8_operand(name(linear), which, x, cast, Fp8Split{});
  return ctx_.fp8_operand(name(linear), which, x, cast, Fp8Split{{&ctx_.tp.group, &ctx_.options.context.group}, {}});
}

void MoeMlp::activation_forward(const Tensor& up, Tensor& act) {
  if (activation_ == Activation::gelu) ctx_.b.gelu_forward(up, act);
  else ctx_.b.swiglu_forward(up, act);
}

void MoeMlp::activation_backward(const Tensor& dact, const Tensor& up, Tensor& dup) {
  if (activation_ == Activation::gelu) ctx_.b.gelu_backward(dact, up, dup);
  else ctx_.b.swiglu_backward(dact, up, dup);
}

Tensor MoeMlp::to_experts(const Tensor& rows, const Saved& s) {
  Backend& b = ctx_.b;
  const std::int64_t C = width_;
  const bool regroup = ctx_.options.expert.size > 1 || etp_ > 1;
  const Tensor source = etp_ > 1 ? gather_blocks(rows, s.block) : rows;
  if (!regroup) return source;
  Tensor grouped = b.empty(Shape{static_cast<std::int64_t>(s.group_index.numel()), C}, rows.dtype());
  if (grouped.numel() > 0) b.gather_rows(source, s.group_index, grouped);
  return grouped;
}

Tensor MoeMlp::from_experts(const Tensor& grouped, const Saved& s) {
  Backend& b = ctx_.b;
  const std::int64_t C = width_;
  const bool regroup = ctx_.options.expert.size > 1 || etp_ > 1;
  if (!regroup) return grouped;
  Tensor blocks = b.empty(Shape{static_cast<std::int64_t>(s.ungroup_index.numel()), C}, grouped.dtype());
  if (blocks.numel() > 0) b.gather_rows(grouped, s.ungroup_index, blocks);
  return etp_ > 1 ? scatter_blocks(blocks, s.received) : blocks;
}

// The router, in fp32, over every token of the micro-batch on every tp
// rank: the routing, the drops and the losses do not depend on the plan.
void MoeMlp::route(Saved& s, std::int64_t N) {
  Backend& b = ctx_.b;
  const std::int64_t E = s_.experts, K = s_.top_k;
  Tensor logits = b.empty(Shape{N, E});
  b.gemm(s.x, ctx_.params[name("router")].value, logits, GemmOp{});
  s.probs = b.empty(Shape{N, E});
  s.lse = b.empty(Shape{N});
  s.weights = b.empty(Shape{N, K});
  s.experts = b.empty(Shape{N, K}, DType::i32);
  b.moe_route(logits, s_.renormalize, s.probs, s.lse, s.weights, s.experts);
  logits = Tensor();
}

// What goes where: the routing decided on the host (or, under a routing
// model, as modelled), the rows sent to each peer and those received.
struct MoeMlp::Dispatch {
  RoutingSummary routing;
  SendPlan send;
  ReceivePlan receive;
  // The index maps' lengths, from the counts: a modelled dispatch builds no maps (the sim holds no values,
  // and building them costs host time and memory in proportion to the tokens).
  std::int64_t sent() const { return std::accumulate(send.peer_rows.begin(), send.peer_rows.end(), std::int64_t{0}); }
  std::int64_t grouped() const {
    return std::accumulate(receive.expert_rows.begin(), receive.expert_rows.end(), std::int64_t{0});
  }
};

MoeMlp::Dispatch MoeMlp::plan_dispatch(const Saved& s, std::int64_t N) {
  Backend& b = ctx_.b;
  const ExpertParallel& ep = ctx_.options.expert;
  const std::int64_t E = s_.experts, K = s_.top_k, El = E / ep.size;
  const std::int64_t capacity = expert_capacity(s_.capacity_factor, N, s_.top_k, s_.experts);
  Dispatch d;
  RoutingSummary& routing = d.routing;
  SendPlan& send = d.send;
  ReceivePlan& receive = d.receive;
  // Rows per local expert: sent (E, to every peer), received ((ep · El) from every peer), and
  // those of the etp ranks ((etp · ep · El)).
  Tensor my_counts = b.empty(Shape{E}, DType::i32), their_counts = b.empty(Shape{E}, DType::i32);
  Tensor all_counts = b.empty(Shape{etp_ * E}, DType::i32);
  const std::vector<std::int64_t> each(static_cast<std::size_t>(ep.size), El);
  if (ctx_.options.routing) {
    ModelledDispatch m = modelled_dispatch(ctx_.options.routing->shares(s_.index, s_.experts, s_.top_k), N, s.rows,
                                           s_.top_k, ep.size, capacity, etp_);
    routing = std::move(m.routing), send = std::move(m.send), receive = std::move(m.receive);
    // Timed as the real exchanges; the sim holds no counts.
    if (ep.size > 1) b.all_to_all(my_counts, each, their_counts, each, ep.group);
    if (etp_ > 1) b.all_gather(their_counts, all_counts, ep.tensor);
  } else {
    // BLOCKS until the router has run. A failed backend reads zeros; its
    // later ops are no-ops and the step returns the error.
    std::vector<float> chosen(static_cast<std::size_t>(N * K));
    (void)b.read(s.experts, chosen);
    std::vector<std::int32_t> ids(chosen.size());
    for (std::size_t i = 0; i < chosen.size(); ++i)
      ids[i] = std::clamp(static_cast<std::int32_t>(chosen[i]), 0, static_cast<std::int32_t>(E - 1));
    routing = summarize_routing(ids, s_.experts, capacity);
    send = plan_send(ids, routing, s_.top_k, s_.experts, ep.size, s.first, s.rows);
    std::vector<std::int64_t> counts(send.expert_rows.begin(), send.expert_rows.end());
    if (ep.size > 1 || etp_ > 1) {
      b.write(my_counts, send.expert_rows);
      Tensor received_counts = my_counts;
      if (ep.size > 1) {
        b.all_to_all(my_counts, each, their_counts, each, ep.group);
        received_counts = their_counts;
      }
      if (etp_ > 1) b.all_gather(received_counts, all_counts, ep.tensor);
      std::vector<float> host(static_cast<std::size_t>(etp_ * E));
      (void)b.read(etp_ > 1 ? all_counts : received_counts, host);
      counts.assign(host.size(), 0);
      for (std::size_t i = 0; i < host.size(); ++i) counts[i] = std::max<std::int64_t>(0, std::llround(host[i]));
    }
    receive = plan_receive(counts, ep.size, etp_, ep.tensor_rank);
  }
  return d;
}

// The dispatch's counts and indices, kept for the backward.
void MoeMlp::keep_dispatch(Saved& s, const Dispatch& d) {
  const std::int64_t K = s_.top_k;
  s.routed = d.routing.routed;
  s.send_rows = d.send.peer_rows;
  s.recv_rows = d.receive.peer_rows;
  s.expert_rows = d.receive.expert_rows;
  s.block = d.receive.block_rows;
  for (std::int64_t r : d.receive.peer_rows) s.received += r;
  s.send_index = upload(d.send.send_index, Shape{d.sent()});
  s.slot_index = upload(d.send.slot_index, Shape{s.rows, K});
  s.group_index = upload(d.receive.group_index, Shape{d.grouped()});
  s.ungroup_index = upload(d.receive.ungroup_index, Shape{etp_ * d.receive.block_rows});
}

// The losses' values and the load figures, once per micro-batch (not in a
// recomputation's first forward).
void MoeMlp::record_statistics(const Saved& s, const RoutingSummary& routing, std::int64_t N) {
  Backend& b = ctx_.b;
  const std::int64_t E = s_.experts, K = s_.top_k;
  MoeStatistics& stats = ctx_.moe_statistics();
  auto& tokens_of = stats.tokens[s_.index];
  if (tokens_of.empty()) tokens_of.assign(static_cast<std::size_t>(E), 0.0);
  for (std::int64_t e = 0; e < E; ++e)
    tokens_of[static_cast<std::size_t>(e)] += static_cast<double>(routing.routed[static_cast<std::size_t>(e)]);
  stats.assignments += static_cast<double>(N * K);
  stats.dropped += static_cast<double>(routing.dropped);
  // E·Σ_e f_e·P_e = E / (N²K) · Σ_e (Σ_n p_ne) · routed_e.
  Tensor column_sums = b.empty(Shape{E});
  b.fill(column_sums, 0.f);
  b.bias_backward(s.probs, column_sums);
  std::vector<float> routed(s.routed.begin(), s.routed.end());
  Tensor routed_t = b.empty(Shape{E, 1});
  b.write(routed_t, routed);
  Tensor balance = stats.losses.slice(0, 1, Shape{1, 1});
  const double scale = static_cast<double>(E) / (static_cast<double>(N) * static_cast<double>(N) * K);
  b.gemm(column_sums.view(Shape{1, E}), routed_t, balance, GemmOp{false, false, static_cast<float>(scale), 1.f});
  Tensor z = b.empty(Shape{1});
  b.sum_squares(s.lse, z, false);
  Tensor z_sum = stats.losses.slice(1, 1);
  b.axpy(static_cast<float>(1.0 / static_cast<double>(N)), z, z_sum);
}

// The shared experts: a dense MLP every token passes, added to `out`.
void MoeMlp::shared_experts(Saved& s, Tensor& out) {
  Backend& b = ctx_.b;
  ctx_.linear(name("shared.up"), s.x_in, s.shared_up, LinearKind::column);
  const std::int64_t shared_width = s.shared_up.shape()[1] / (activation_ == Activation::swiglu ? 2 : 1);
  s.shared_act = b.empty(Shape{s.shared_up.shape()[0], shared_width}, ctx_.act);
  activation_forward(s.shared_up, s.shared_act);
  Tensor shared;
  ctx_.linear(name("shared.down"), s.shared_act, shared, LinearKind::row);
  b.add(out, shared, out);
}

Phased<Tensor> MoeMlp::forward(const MicroBatch& mb, std::int64_t tokens, Tensor x_in,
                               std::unique_ptr<Block::Saved>* saved) {
  Backend& b = ctx_.b;
  const std::int64_t N = tokens, C = width_, F = ffn_;
  const std::int64_t R = ctx_.local_rows(N);
  const std::int64_t up_width = activation_ == Activation::swiglu ? 2 * F : F;
  auto s = std::make_unique<Saved>();
  s->x_in = x_in.view(Shape{R, C});
  s->x = ctx_.sp ? ctx_.sp_gather(s->x_in) : s->x_in;
  s->tokens = N;
  s->rows = split_rows_ ? N / ctx_.tp.size : N;
  s->first = split_rows_ ? ctx_.tp.rank * s->rows : 0;
  route(*s, N);
  const Dispatch d = plan_dispatch(*s, N);
  keep_dispatch(*s, d);
  const std::int64_t S = d.sent(), M = d.grouped();

  // Dispatch: send order, the EP peers, the etp ranks' blocks, expert order.
  Tensor sent = b.empty(Shape{S, C}, ctx_.act);
  if (S > 0) b.gather_rows(s->x.rows(s->first, s->rows), s->send_index, sent);
  Event arrived;
  Tensor received = exchange(sent, d.send.peer_rows, d.receive.peer_rows, arrived);
  co_yield Pause{};
  arrive(arrived);
  sent = Tensor();
  s->grouped = to_experts(received, *s);
  received = Tensor();

  // The experts: one GEMM per local expert over its rows (this rank's slice
  // of each expert's matrices under etp).
  const Tensor w_up = fp8_operand("up", Fp8Operand::weight, ctx_.params[name("up")].value, Fp8Cast::made, M);
  const Tensor w_down = fp8_operand("down", Fp8Operand::weight, ctx_.params[name("down")].value, Fp8Cast::made, M);
  s->up = b.empty(Shape{M, up_width}, ctx_.act);
  s->act = b.empty(Shape{M, F}, ctx_.act);
  Tensor down = b.empty(Shape{M, C}, ctx_.act);
  const Tensor grouped = fp8_operand("up", Fp8Operand::input, s->grouped, Fp8Cast::made, M);
  expert_gemm(grouped, w_up, s->up, GemmOp{}, s->expert_rows);
  if (M > 0) activation_forward(s->up, s->act);
  expert_gemm(fp8_operand("down", Fp8Operand::input, s->act, Fp8Cast::made, M), w_down, down, GemmOp{}, s->expert_rows);
  // Recompute module moe_act: backward makes the activation again from the kept up output.
  if (ctx_.options.recompute_modules.moe_act) s->act = Tensor();

  // Back (summed over the etp slices) to the tokens' ranks, in send order,
  // and the weighted sum per token: each tp rank holds its tokens' outputs whole.
  Tensor outputs = from_experts(down, *s);
  down = Tensor();
  s->back = exchange(outputs, d.receive.peer_rows, d.send.peer_rows, arrived);
  co_yield Pause{};
  arrive(arrived);
  outputs = Tensor();
  Tensor combined = b.empty(Shape{s->rows, C}, ctx_.act);
  b.moe_combine(s->back, s->slot_index, s->weights.rows(s->first, s->rows), combined);
  Tensor out = split_rows_ && !ctx_.sp ? ctx_.sp_gather(combined) : combined;
  if (s_.shared_experts > 0) shared_experts(*s, out);
  if (saved) {
    record_statistics(*s, d.routing, N);
    *saved = std::move(s);
  }
  (void)mb;
  co_return out;
}

Tensor MoeMlp::shared_experts_backward(const Saved& s, const Tensor& dout) {
  Tensor dact, dup = ctx_.b.empty(s.shared_up.shape(), ctx_.act), dx;
  ctx_.linear_backward(name("shared.down"), s.shared_act, dout, &dact, LinearKind::row);
  activation_backward(dact, s.shared_up, dup);
  ctx_.linear_backward(name("shared.up"), s.x_in, dup, &dx, LinearKind::column,
                       s.input_recomputed ? Fp8Cast::made : Fp8Cast::kept);
  return dx;
}

Tensor MoeMlp::experts_backward(const Saved& s, Tensor ddown) {
  Backend& b = ctx_.b;
  const std::int64_t C = width_, F = ffn_, M = s.grouped.numel() / C;
  const std::int64_t up_width = activation_ == Activation::swiglu ? 2 * F : F;
  const ParamSlot& up = ctx_.params[name("up")];
  const ParamSlot& down = ctx_.params[name("down")];
  Tensor dact = b.empty(Shape{M, F}, ctx_.act), dup = b.empty(Shape{M, up_width}, ctx_.act);
  Tensor dgrouped = b.empty(Shape{M, C}, ctx_.act);
  Tensor down_grad = down.grad, up_grad = up.grad;
  GemmOp dgrad, wgrad;  // dx = dy · Wᵀ; dW += xᵀ · dy
  dgrad.trans_b = true;
  wgrad.trans_a = true, wgrad.beta = 1.f;
  // FP8: as a linear's backward (BlockContext::linear_backward), both GEMMs read the output
  // gradient's cast, dgrad the weight's and wgrad the input's (the forward's). The casts and
  // the operands they stand for are freed on return, before the caller's exchange.
  const Tensor ddown_q = fp8_operand("down", Fp8Operand::grad, ddown, Fp8Cast::made, M);
  const Tensor w_down = fp8_operand("down", Fp8Operand::weight, down.value, Fp8Cast::kept, M);
  expert_gemm(ddown_q, w_down, dact, dgrad, s.expert_rows);
  // Recompute module moe_act: the activation made again from the up output, and its FP8 cast with
  // it (a run that kept the cast would have kept what the recomputation frees).
  Tensor act_in = s.act;
  if (!act_in.defined()) {
    act_in = b.empty(Shape{M, F}, ctx_.act);
    if (M > 0) activation_forward(s.up, act_in);
  }
  const Tensor act =
      fp8_operand("down", Fp8Operand::input, act_in, s.act.defined() ? Fp8Cast::kept : Fp8Cast::made, M);
  expert_gemm(act, ddown_q, down_grad, wgrad, s.expert_rows);
  if (M > 0) activation_backward(dact, s.up, dup);
  const Tensor dup_q = fp8_operand("up", Fp8Operand::grad, dup, Fp8Cast::made, M);
  const Tensor w_up = fp8_operand("up", Fp8Operand::weight, up.value, Fp8Cast::kept, M);
  expert_gemm(dup_q, w_up, dgrouped, dgrad, s.expert_rows);
  const Tensor grouped = fp8_operand("up", Fp8Operand::input, s.grouped, Fp8Cast::kept, M);
  expert_gemm(grouped, dup_q, up_grad, wgrad, s.expert_rows);
  return dgrouped;
}

// dsent (S, C): the input gradients of this rank's dispatched slots, in send order.
Tensor MoeMlp::token_gradients(const Saved& s, const Tensor& dsent) {
  Backend& b = ctx_.b;
  const std::int64_t C = width_, S = s.send_index.numel();
  // Each token sums its slots' gradients in send order (by expert): the same order at every plan.
  Tensor dx_rows = b.empty(Shape{s.rows, C});
  b.fill(dx_rows, 0.f);
  if (S > 0) b.embedding_backward(dsent, s.send_index, dx_rows, 0);
  if (ctx_.act == DType::f32) return dx_rows;
  Tensor cast = b.empty(Shape{s.rows, C}, ctx_.act);
  b.cast(dx_rows, cast);
  return cast;
}

Tensor MoeMlp::router_backward(const Saved& s, const Tensor& dweights, float loss_scale) {
  Backend& b = ctx_.b;
  const std::int64_t N = s.tokens, C = width_, E = s_.experts, K = s_.top_k;
  // The weights' gradient of every token, the balance loss, the z-loss.
  Tensor dweights_all = dweights;
  if (split_rows_) {
    dweights_all = b.empty(Shape{N, K});
    b.all_gather(dweights, dweights_all, ctx_.tp.group);
  }
  std::vector<float> prob_grad(static_cast<std::size_t>(E));
  const double balance = static_cast<double>(loss_scale) * s_.aux_loss_coeff * static_cast<double>(E) /
                         (static_cast<double>(N) * static_cast<double>(K));
  for (std::size_t e = 0; e < prob_grad.size(); ++e)
    prob_grad[e] = static_cast<float>(balance * static_cast<double>(s.routed[e]));
  Tensor prob_grad_t = b.empty(Shape{E});
  b.write(prob_grad_t, prob_grad);
  Tensor dlogits = b.empty(Shape{N, E});
  b.moe_route_backward(dweights_all, s.probs, s.lse, s.experts, prob_grad_t, s_.z_loss_coeff * loss_scale,
                       s_.renormalize, dlogits);
  if (ctx_.act != DType::f32) {
    Tensor cast = b.empty(Shape{N, E}, ctx_.act);
    b.cast(dlogits, cast);
    dlogits = cast;
  }
  const ParamSlot& router = ctx_.params[name("router")];
  Tensor drouter = router.grad;
  // Every tp rank routed all N tokens: each holds the whole router gradient.
  b.gemm(s.x, dlogits, drouter, GemmOp{true, false, 1.f, 1.f});
  Tensor dx_router = b.empty(Shape{N, C}, ctx_.act);
  b.gemm(dlogits, router.value, dx_router, GemmOp{false, true});
  return dx_router;
}

void MoeMlp::release_input(Block::Saved& saved) {
  Saved& s = static_cast<Saved&>(saved);
  s.x_in = Tensor(), s.x = Tensor();
}

void MoeMlp::restore_input(Block::Saved& saved, const Tensor& x) {
  Saved& s = static_cast<Saved&>(saved);
  s.x_in = x.view(Shape{x.numel() / width_, width_});
  s.x = ctx_.sp ? ctx_.sp_gather(s.x_in) : s.x_in;
  s.input_recomputed = true;
}

Phased<Tensor> MoeMlp::backward(const MicroBatch& mb, Block::Saved& saved, Tensor dout_in, float loss_scale) {
  Backend& b = ctx_.b;
  Saved& s = static_cast<Saved&>(saved);
  const std::int64_t C = width_, K = s_.top_k, S = s.send_index.numel();
  const Tensor dout = dout_in.view(Shape{ctx_.local_rows(s.tokens), C});
  const Tensor dx_shared = s_.shared_experts > 0 ? shared_experts_backward(s, dout) : Tensor();

  // The combine's gradient on this rank's dispatched rows.
  const Tensor dcombined = split_rows_ && !ctx_.sp ? ctx_.local_part(dout) : dout;
  Tensor dback = b.empty(Shape{S, C}, ctx_.act), dweights = b.empty(Shape{s.rows, K});
  b.moe_combine_backward(dcombined, s.back, s.slot_index, s.weights.rows(s.first, s.rows), dback, dweights);

  // To the experts again (every etp rank needs every row's output gradient), and their backward.
  Event arrived;
  Tensor dreceived = exchange(dback, s.send_rows, s.recv_rows, arrived);
  co_yield Pause{};
  arrive(arrived);
  dback = Tensor();
  Tensor ddown = to_experts(dreceived, s);
  dreceived = Tensor();
  // Separate statements: each step's arguments are freed before the next step allocates.
  Tensor dgrouped = experts_backward(s, std::move(ddown));
  // The input gradients summed over the etp slices, back to the tokens' ranks.
  Tensor dslots = from_experts(dgrouped, s);
  dgrouped = Tensor();
  Tensor dsent = exchange(dslots, s.recv_rows, s.send_rows, arrived);
  co_yield Pause{};
  arrive(arrived);
  dslots = Tensor();
  Tensor dx_rows = token_gradients(s, dsent);
  dsent = Tensor();
  const Tensor dx_router = router_backward(s, dweights, loss_scale);

  // This rank's tokens' gradient from the experts, the whole router's (the
  // same on every tp rank, so taken once: its rows, not a sum).
  Tensor dx;
  if (split_rows_ && ctx_.sp) {
    dx = dx_rows;
    b.add(dx, ctx_.local_part(dx_router), dx);
  } else {
    dx = split_rows_ ? ctx_.sp_gather(dx_rows) : dx_rows;
    b.add(dx, dx_router, dx);
  }
  if (dx_shared.defined()) b.add(dx, dx_shared, dx);
  (void)mb;
  co_return dx;
}

}  // namespace meshtrain
