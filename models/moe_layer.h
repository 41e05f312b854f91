// The mixture-of-experts MLP of a transformer layer (Shazeer et al. 2017;
// Switch, Fedus et al. 2021; GShard, Lepikhin et al. 2020; Mixtral): a router
// sends each token to top_k of E expert MLPs (GELU or SwiGLU, width ffn,
// no biases) and sums their outputs weighted by the router's probabilities;
// optional shared experts (DeepSeek, Qwen2-MoE) are one dense MLP of width
// shared_experts · ffn that every token passes through, added ungated.
//
// Data path of one micro-batch of N tokens (models/moe_dispatch.h has the
// host side):
//   x (N, C) ── router GEMM (fp32 logits) ── moe_route: probs, top-k experts
//   and weights ── read the experts to the host (BLOCKS: the counts size the
//   all-to-alls, as in Megatron-Core) ── capacity drops and the send plan ──
//   all_to_all of the per-expert counts over the EP group ── gather_rows into
//   send order ── all_to_all (per-peer row counts) ── gather_rows into
//   expert order ── the local experts' up GEMMs as one grouped GEMM,
//   activation, down GEMMs likewise (Backend::grouped_gemm) ── the
//   inverse gather and all_to_all back ── moe_combine (each token's slots in
//   slot order). Backward mirrors it; a token's dispatch gradient sums its
//   slots with embedding_backward in send order, and the router receives
//   the combine weights' gradient plus the auxiliary losses'.
//
// Tensor parallelism, as Megatron-Core's all-to-all dispatcher. Every tp
// rank routes all N tokens (gathered under sequence parallelism), so the
// routing, the drops and the losses are the same on all of them, but tp rank
// t dispatches only tokens [t·N/tp, (t+1)·N/tp) (its sequence shard under
// SP; without SP the outputs are all-gathered over tp). With expert tensor
// parallelism etp = tp each expert's up matrix is split by columns and its
// down matrix by rows over the tp group: after the all-to-all the etp ranks
// all-gather what they received, compute their slices over all of it, and
// reduce-scatter the outputs back. With etp = 1 the experts are whole and
// the EP group spans tp ranks, as Megatron-Core's expert mesh lays it out.
//
// Losses (per micro-batch, added to the objective with weight 1 / the global
// batch's micro-batches, i.e. a mean over micro-batches, summed over MoE
// layers): the load-balancing loss aux_loss_coeff · E · Σ_e f_e · P_e, f_e the
// share of the N·K assignments routed to e (before drops) and P_e the mean
// router probability of e (Switch eq. 4; Megatron-Core's
// switch_load_balancing_loss_func); the router z-loss z_loss_coeff ·
// mean_n lse_n² (ST-MoE, Zoph et al. 2022).
//
// Legend: N tokens of the micro-batch, R this rank's rows of them (N, or N/tp
// under SP), C width, E experts, El = E/ep local experts, K = top_k, F ffn per
// expert on this rank (F/etp), S rows sent, M rows received.
#pragma once

#include <memory>
#include <string>

#include "models/block.h"
#include "models/fp8_linear.h"
#include "models/parameters.h"

namespace meshtrain {

struct RoutingSummary;  // models/moe_dispatch.h

struct MoeShape {
  int experts = 0, top_k = 0, shared_experts = 0;
  bool renormalize = true;
  float capacity_factor = 0.f, aux_loss_coeff = 0.f, z_loss_coeff = 0.f;
  int index = 0;  // this layer's place among the model's MoE layers (statistics, routing model)
};

// The MoE MLP's parameters under `prefix` ("layers.3.moe"): router (C, E)
// replicated, up (E, C, F or 2F) and down (E, F, C) split over experts (ep)
// and over etp like the dense MLP, and the shared experts' linear layers.
void add_moe_parameters(ParamTableBuilder& t, const std::string& prefix, int width, int ffn, Activation activation,
                        bool bias, const MoeShape& s);

// Bytes one MoE MLP saves for backward for `rows` tokens (uniform routing:
// each EP rank receives rows·K assignments), at value size `value_bytes`, with
// the expert matrices split over `etp` and the shared experts over `tp`;
// `recompute_act`: the experts' activation is not kept (recompute module moe_act).
double moe_activation_bytes(double rows, int width, int ffn, Activation activation, const MoeShape& s,
                            double value_bytes, int tp, int etp, bool recompute_act = false);

class MoeMlp {
 public:
  MoeMlp(BlockContext& ctx, std::string prefix, int width, int ffn, Activation activation, MoeShape shape);
  ~MoeMlp();
  // x (R, C): the layer's normalised input; returns the MLP output (R, C),
  // summed over tp. `saved` null: keep nothing (a recomputed forward).
  // Three phases (core/phased.h), as Megatron-Core's EP overlap cuts a layer,
  // each issuing its all-to-all as it ends, before the other pass's work:
  // routing, the send-order gather, the dispatch | the experts, the combine |
  // the weighted sum and shared experts.
  Phased<Tensor> forward(const MicroBatch& mb, std::int64_t tokens, Tensor x, std::unique_ptr<Block::Saved>* saved);
  // d output (R, C) -> d x (R, C); accumulates the parameter gradients.
  // Three phases likewise: the combine's gradient and its all-to-all | the
  // experts' backward and the dispatch's all-to-all | the tokens' sums and
  // the router.
  Phased<Tensor> backward(const MicroBatch& mb, Block::Saved& saved, Tensor dout, float loss_scale);
  // Recompute module layernorm (the layer's pre-MLP norm, models/flops.h): forward's input, kept
  // for the router's and the shared experts' backward, is let go, and given back (made again by
  // the layer) before backward; under sequence parallelism the router's gathered copy is gathered
  // again.
  void release_input(Block::Saved& saved);
  void restore_input(Block::Saved& saved, const Tensor& x);

 private:
  struct Saved;
  struct Dispatch;
  // The steps of forward, in order.
  void route(Saved& s, std::int64_t tokens);
  Dispatch plan_dispatch(const Saved& s, std::int64_t tokens);
  void keep_dispatch(Saved& s, const Dispatch& d);
  void shared_experts(Saved& s, Tensor& out);
  void record_statistics(const Saved& s, const RoutingSummary& routing, std::int64_t tokens);
  // The steps of backward, in order: the shared experts' input gradient; the
  // routed experts' GEMMs from their output gradient (M, C) to their input
  // gradient (M, C), weight gradients added; each token's sum of its slots'
  // gradients (rows, C); the router's input gradient (N, C).
  Tensor shared_experts_backward(const Saved& s, const Tensor& dout);
  Tensor experts_backward(const Saved& s, Tensor ddown);
  Tensor token_gradients(const Saved& s, const Tensor& dsent);
  Tensor router_backward(const Saved& s, const Tensor& dweights, float loss_scale);
  // in (rows, C) to the EP peers by `send` rows each; `recv` rows arrive (ep 1: `in` itself).
  // With an expert stream (ChunkOptions::expert_stream) the all-to-all runs there, after the
  // compute stream's work so far, and `done` is its end, for arrive(); `in` must live until then.
  Tensor exchange(const Tensor& in, const std::vector<std::int64_t>& send, const std::vector<std::int64_t>& recv,
                  Event& done);
  // The compute stream's later work waits for an exchange's `done` (no-op without one).
  void arrive(const Event& done);
  // Received rows (rows, C) -> (etp · block, C): every etp rank's, each block padded with zero rows.
  Tensor gather_blocks(const Tensor& rows, std::int64_t block);
  // (etp · block, C) partial sums -> this rank's first `received` rows of its block, summed over etp.
  Tensor scatter_blocks(const Tensor& blocks, std::int64_t received);
  // Received rows -> (M, C) in expert order (gathered over etp), and back.
  Tensor to_experts(const Tensor& rows, const Saved& s);
  Tensor from_experts(const Tensor& grouped, const Saved& s);
  Tensor upload(const std::vector<std::int32_t>& host, Shape shape);
  // Expert e's slice of an (El, a, b) expert weight or its gradient.
  Tensor expert_matrix(const Tensor& all, int e) const;
  // The local experts' GEMMs as one grouped GEMM (Backend::grouped_gemm) over their expert_rows:
  // c_e = a_e · op(W_e) with b the (El, ., .) weights, or (op.trans_a) the
  // weight gradients c (El, ., .) += a_eᵀ · b_e.
  void expert_gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op,
                   const std::vector<std::int64_t>& expert_rows);
  // `x`, or its FP8 cast under precision fp8 (BlockContext::fp8_operand), for a GEMM of expert
  // linear `linear` ("up", "down") over `rows` grouped rows.
  Tensor fp8_operand(const char* linear, Fp8Operand which, const Tensor& x, Fp8Cast cast, std::int64_t rows);
  void activation_forward(const Tensor& up, Tensor& act);
  void activation_backward(const Tensor& dact, const Tensor& up, Tensor& dup);
  std::string name(const char* what) const { return prefix_ + "." + what; }

  BlockContext& ctx_;
  std::string prefix_;
  int width_, ffn_;  // ffn_: per expert on this rank
  Activation activation_;
  MoeShape s_;
  int etp_;          // ranks splitting each expert's matrices (1, or tp)
  bool split_rows_;  // tp > 1: each tp rank dispatches its N/tp of the tokens
};

}  // namespace meshtrain
