// Op timing on the sim backend: each compute op becomes one executor task
// of its cost-model duration on the current stream.
#include "backends/sim/sim_backend.h"

#include <algorithm>

#include "backends/op_table.h"
#include "backends/sim/sim_internal.h"

namespace meshtrain {

using sim_internal::misuse;
using sim_internal::seconds;

double SimBackend::compute_seconds() const { return seconds(compute_); }
double SimBackend::compute_stream_seconds() const { return seconds(compute_stream_); }

std::string SimBackend::set_region(std::string name) {
  std::swap(region_, name);
  current_region_ = nullptr;
  return name;
}

sim::NameId SimBackend::op_name(std::string_view name) { return cluster_.executor_->intern(name); }

sim::DType SimBackend::compute_dtype(DType t) const {
  return t == DType::bf16 || t == DType::f16 ? sim::DType::kBf16 : sim::DType::kFp32;
}

sim::DType SimBackend::gemm_dtype(DType t, std::int64_t m, std::int64_t n, std::int64_t k, const GemmOp& op) const {
  const sim::DType d = compute_dtype(t);
  if (!fp8_gemms_ || d != sim::DType::kBf16) return d;
  const std::int64_t w = fp8_exempt_width_;
  if (m == w || n == w || k == w) return d;
  return op.trans_a || op.trans_b ? sim::DType::kFp8Split : sim::DType::kFp8;
}

void SimBackend::compute(sim::NameId name, sim::Time duration) {
  if (cluster_.error_) return;
  compute_ += duration;
  if (current_.id == 0) compute_stream_ += duration;
  region().compute_s += seconds(duration);
  if (Status s = cluster_.executor_->compute(executor_stream(current_), name, duration); !s)
    cluster_.fail(std::move(s).error());
}

void SimBackend::off_device(sim::NameId name, sim::Time duration) {
  if (cluster_.error_) return;
  if (Status s = cluster_.executor_->compute(executor_stream(current_), name, duration); !s)
    cluster_.fail(std::move(s).error());
}

void SimBackend::charge(const OpInfo& op, std::initializer_list<const Tensor*> tensors) {
  charge(op, OpArgs{std::span<const Tensor* const>(tensors.begin(), tensors.size())});
}
void SimBackend::charge(const OpInfo& op, const OpArgs& args) {
  const OpCost c = op_cost(op, args);
  compute(op_name(op.cost_name), cluster_.cost_.memory_bound(c.bytes, op.cost_name));
}

void SimBackend::checked_charge(const char* op, std::initializer_list<const Tensor*> tensors) {
  checked_charge(op, tensors, tensors);
}
void SimBackend::checked_charge(const char* op, std::initializer_list<const Tensor*> checked,
                                std::initializer_list<const Tensor*> tensors) {
  check_all(op, checked);
  charge(op_info(op), tensors);
}
void SimBackend::check_all(const char* op, std::initializer_list<const Tensor*> tensors) const {
  for (const Tensor* t : tensors) check(*t, op);
}

void SimBackend::fill(Tensor& x, float) {
  checked_charge("fill", {&x});
}
void SimBackend::copy(const Tensor& src, Tensor& dst) {
  check(src, "copy"), check(dst, "copy");
  if (src.numel() != dst.numel() || src.dtype() != dst.dtype())
    misuse("copy: {} {} into {} {}", src.shape().str(), dtype_name(src.dtype()), dst.shape().str(),
           dtype_name(dst.dtype()));
  if (on_host(src) || on_host(dst)) {
    const sim::Time t = cluster_.host_copy(static_cast<double>(src.bytes()), world_size_);
    host_work_.copy_bytes += static_cast<double>(src.bytes());
    host_work_.copy_s += seconds(t);
    off_device(op_name(on_host(src) ? "copy_h2d" : "copy_d2h"), t);
    return;
  }
  charge(op_info("copy"), {&src, &dst});
}
void SimBackend::cast(const Tensor& src, Tensor& dst) {
  check(src, "cast"), check(dst, "cast");
  if (src.numel() != dst.numel()) misuse("cast: {} into {}", src.shape().str(), dst.shape().str());
  charge(op_info("cast"), {&src, &dst});
}
void SimBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  checked_charge("add", {&a, &b, &out});
}
void SimBackend::scale(Tensor& x, float) {
  checked_charge("scale", {&x});
}
void SimBackend::axpy(float, const Tensor& x, Tensor& y) {
  checked_charge("axpy", {&x, &y});
}
void SimBackend::sum(const Tensor& x, Tensor& out, float, bool) {
  checked_charge("sum", {&x, &out});
}
void SimBackend::sum_squares(const Tensor& x, Tensor& out, bool) {
  checked_charge("sum_squares", {&x, &out});
}

void SimBackend::amax(const Tensor& x, Tensor& out) {
  checked_charge("amax", {&x, &out});
}

void SimBackend::fp8_cast(const Tensor& x, const Fp8CastOp& op, Tensor& y, Tensor& amax) {
  check(x, "fp8_cast"), check(y, "fp8_cast"), check(amax, "fp8_cast");
  if (x.numel() != y.numel() || amax.numel() != 1)
    misuse("fp8_cast: x {} into y {} with amax {} (one element)", x.shape().str(), y.shape().str(),
           amax.shape().str());
  if (op.copies <= 0) return;  // a cast a real run kept: no kernel
  const Tensor* tensors[] = {&x, &y, &amax};
  OpArgs args{tensors};
  args.fp8_cast = &op;
  charge(op_info("fp8_cast"), args);
}

void SimBackend::gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) {
  check(a, "gemm"), check(b, "gemm"), check(c, "gemm");
  const MatmulDims d = op_cost(op_info("gemm"), {&a, &b, &c}).matmuls.front();
  if (d.m * d.k != a.numel() || d.k * d.n != b.numel())
    misuse("gemm: a {} b {} c {} do not agree", a.shape().str(), b.shape().str(), c.shape().str());
  // The epilogue stores c in its own dtype, after reading it when the product is added (beta != 0).
  const sim::GemmOutput out{static_cast<double>(dtype_size(c.dtype())), op.beta != 0.f};
  compute(op_name("gemm"), cluster_.cost_.gemm(d.m, d.n, d.k, gemm_dtype(a.dtype(), d.m, d.n, d.k, op), 1, out));
}
void SimBackend::grouped_gemm(const std::vector<Tensor>& a, const std::vector<Tensor>& b, std::vector<Tensor>& c,
                              const GemmOp& op) {
  if (a.empty() || a.size() != b.size() || a.size() != c.size())
    misuse("grouped_gemm: {} a, {} b and {} c operands must be one per group, at least one", a.size(), b.size(),
           c.size());
  // Each group's (m, n, k) as the table reads them; the groups share n and either k (row groups: experts
  // over their tokens) or m (weight gradients, reduced over each group's tokens).
  std::vector<const Tensor*> operands;
  for (std::size_t g = 0; g < a.size(); ++g) {
    check(a[g], "grouped_gemm"), check(b[g], "grouped_gemm"), check(c[g], "grouped_gemm");
    operands.insert(operands.end(), {&a[g], &b[g], &c[g]});
  }
  const OpCost cost = op_cost(op_info("grouped_gemm"), OpArgs{operands});
  std::vector<std::int64_t> ms, ks;
  const std::int64_t n = c.front().shape().back();
  for (std::size_t g = 0; g < a.size(); ++g) {
    const std::int64_t m = cost.matmuls[g].m, k = cost.matmuls[g].k;
    if (c[g].shape().back() != n || m * k != a[g].numel() || k * n != b[g].numel())
      misuse("grouped_gemm: group {}: a {} b {} c {} do not agree with the groups' n {}", g, a[g].shape().str(),
             b[g].shape().str(), c[g].shape().str(), n);
    ms.push_back(m), ks.push_back(k);
  }
  const sim::DType t = gemm_dtype(a.front().dtype(), ms.front(), n, ks.front(), op);
  const sim::GemmOutput out{static_cast<double>(dtype_size(c.front().dtype())), op.beta != 0.f};
  if (op.trans_a) {
    for (std::int64_t m : ms)
      if (m != ms.front()) misuse("grouped_gemm: weight-gradient groups must share m, got {} and {}", ms.front(), m);
  } else {
    for (std::int64_t k : ks)
      if (k != ks.front()) misuse("grouped_gemm: row groups must share k, got {} and {}", ks.front(), k);
  }
  if (!cluster_.options_.kernels.moe_grouped_gemm) {
    // One GEMM per expert, one after another (Megatron's SequentialMLP): each its own launch and waves.
    for (std::size_t g = 0; g < a.size(); ++g) compute(op_name("expert_gemm"), cluster_.cost_.gemm(ms[g], n, ks[g], t, 1, out));
    return;
  }
  if (op.trans_a)
    return compute(op_name("grouped_gemm"), cluster_.cost_.grouped_gemm_wgrad(ks, ms.front(), n, t, out));
  compute(op_name("grouped_gemm"), cluster_.cost_.grouped_gemm(ms, n, ks.front(), t));
}
void SimBackend::batched_gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp&) {
  check(a, "batched_gemm"), check(b, "batched_gemm"), check(c, "batched_gemm");
  if (a.shape().rank() != 3 || c.shape().rank() != 3)
    misuse("batched_gemm: a {} and c {} must be (L, ., .)", a.shape().str(), c.shape().str());
  const MatmulDims d = op_cost(op_info("batched_gemm"), {&a, &b, &c}).matmuls.front();
  compute(op_name("batched_gemm"), cluster_.cost_.gemm(d.m, d.n, d.k, compute_dtype(a.dtype()), d.batch));
}
void SimBackend::bias_backward(const Tensor& dy, Tensor& db) {
  checked_charge("bias_backward", {&dy, &db});
}

void SimBackend::embedding_forward(const Tensor& table, const Tensor& ids, Tensor& out,
                                   std::int64_t) {
  checked_charge("embedding_forward", {&table, &ids, &out});
}

// One op under the per-tensor op's name, timed by the bytes of all its tensors.
void SimBackend::foreach_sum_squares(std::span<const Tensor> xs, Tensor& out) {
  check(out, "sum_squares");
  std::vector<const Tensor*> operands = {&out};
  for (const Tensor& x : xs) check(x, "sum_squares"), operands.push_back(&x);
  charge(op_info("foreach_sum_squares"), OpArgs{operands});
}

void SimBackend::sign_compress(const Tensor& x, Tensor& error, Tensor& packets) {
  check(x, "sign_compress"), check(packets, "sign_compress");
  if (error.defined()) check(error, "sign_compress");
  charge(op_info("sign_compress"), {&x, &error, &packets});
}
void SimBackend::sign_decompress(const Tensor& packets, Tensor& out) {
  checked_charge("sign_decompress", {&packets, &out});
}

void SimBackend::foreach_adamw(std::span<const AdamWTensors> params, const Tensor& coef, const AdamWOp&) {
  const bool host = !params.empty() && on_host(params.front().param);
  std::vector<const Tensor*> operands = {&coef};
  for (const AdamWTensors& t : params) {
    check(t.param, "foreach_adamw"), check(t.grad, "foreach_adamw"), check(t.m, "foreach_adamw"),
        check(t.v, "foreach_adamw");
    for (const Tensor* x : {&t.param, &t.grad, &t.m, &t.v})
      if (on_host(*x) != host) misuse("foreach_adamw: host and device tensors in one update");
    operands.insert(operands.end(), {&t.param, &t.grad, &t.m, &t.v});
  }
  if (!host) return charge(op_info("foreach_adamw"), OpArgs{operands});
  const OpInfo& op = op_info("host_adamw");
  const sim::Time t = cluster_.cost_.host_adamw(op_cost(op, OpArgs{operands}).bytes, cluster_.host_sharing(world_size_));
  host_work_.adamw_s += seconds(t);
  off_device(op_name(op.cost_name), t);
}

void SimBackend::gather_rows(const Tensor& src, const Tensor& index, Tensor& out) {
  checked_charge("gather_rows", {&src, &index, &out});
}
void SimBackend::moe_route(const Tensor& logits, bool, Tensor& probs, Tensor& lse, Tensor& weights,
                           Tensor& experts) {
  checked_charge("moe_route", {&logits, &probs, &experts}, {&logits, &probs, &lse, &weights, &experts});
}
void SimBackend::moe_route_backward(const Tensor& dweights, const Tensor& probs, const Tensor& lse,
                                    const Tensor& experts, const Tensor& prob_grad, float, bool, Tensor& dlogits) {
  checked_charge("moe_route_backward", {&probs, &dlogits},
                 {&dweights, &probs, &lse, &experts, &prob_grad, &dlogits});
}
void SimBackend::moe_combine(const Tensor& rows, const Tensor& index, const Tensor& weights, Tensor& out) {
  checked_charge("moe_combine", {&rows, &index, &out}, {&rows, &index, &weights, &out});
}
void SimBackend::moe_combine_backward(const Tensor& dout, const Tensor& rows, const Tensor& index,
                                      const Tensor& weights, Tensor& drows, Tensor& dweights) {
  checked_charge("moe_combine_backward", {&dout, &drows},
                 {&dout, &rows, &index, &weights, &drows, &dweights});
}
void SimBackend::embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable,
                                    std::int64_t) {
  checked_charge("embedding_backward", {&dout, &ids, &dtable});
}

void SimBackend::layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                   Tensor& out, Tensor& mean, Tensor& rstd, float) {
  checked_charge("layernorm_forward", {&x, &out}, {&x, &weight, &bias, &out, &mean, &rstd});
}
void SimBackend::layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                    const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                    Tensor& dweight, Tensor& dbias) {
  checked_charge("layernorm_backward", {&dout, &dx}, {&dout, &x, &weight, &mean, &rstd, &dx, &dweight, &dbias});
}
void SimBackend::rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& out, Tensor& rstd,
                                 float) {
  checked_charge("rmsnorm_forward", {&x, &out}, {&x, &weight, &out, &rstd});
}
void SimBackend::rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                  const Tensor& rstd, Tensor& dx, Tensor& dweight) {
  checked_charge("rmsnorm_backward", {&dout, &dx}, {&dout, &x, &weight, &rstd, &dx, &dweight});
}

void SimBackend::gelu_forward(const Tensor& x, Tensor& out) {
  checked_charge("gelu_forward", {&x, &out});
}
void SimBackend::gelu_backward(const Tensor& dout, const Tensor& x, Tensor& dx) {
  checked_charge("gelu_backward", {&dout, &dx}, {&dout, &x, &dx});
}
void SimBackend::swiglu_forward(const Tensor& x, Tensor& out) {
  checked_charge("swiglu_forward", {&x, &out});
}
void SimBackend::swiglu_backward(const Tensor& dout, const Tensor& x, Tensor& dx) {
  checked_charge("swiglu_backward", {&dout, &dx}, {&dout, &x, &dx});
}
void SimBackend::dropout_forward(const Tensor& x, Tensor& out, const DropoutOp&) {
  checked_charge("dropout_forward", {&x, &out});
}
void SimBackend::dropout_backward(const Tensor& dout, Tensor& dx, const DropoutOp&) {
  checked_charge("dropout_backward", {&dout, &dx});
}

void SimBackend::rope(Tensor& x, int heads_total, int rotate_heads, float, bool, std::int64_t) {
  check(x, "rope");
  const Tensor* tensors[] = {&x};
  OpArgs args{tensors};
  args.share = heads_total > 0 ? static_cast<double>(rotate_heads) / heads_total : 1.0;
  charge(op_info("rope"), args);
}

void SimBackend::attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse,
                                   const AttentionOp& op) {
  check(qkv, "attention_forward"), check(out, "attention_forward"), check(lse, "attention_forward");
  if (qkv.shape().rank() != 4)
    misuse("attention_forward: qkv {} must be (B, T, H + 2G, D)", qkv.shape().str());
  if (cluster_.options_.kernels.attention == AttentionImpl::unfused)
    return unfused_attention(qkv.shape()[0] * op.heads, qkv.shape()[1], op.window_rows(qkv.shape()[1]),
                             op.head_dim, qkv.dtype(), false);
  const Tensor* tensors[] = {&qkv, &out, &lse};
  OpArgs args{tensors};
  args.attention = &op;
  fused_attention(op_info("attention_forward"), args, qkv.dtype());
  score_terms(qkv, op, false);
}
void SimBackend::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, Tensor& dqkv, const AttentionOp& op) {
  check(dout, "attention_backward"), check(qkv, "attention_backward"),
      check(out, "attention_backward");
  check(lse, "attention_backward"), check(dqkv, "attention_backward");
  if (qkv.shape().rank() != 4)
    misuse("attention_backward: qkv {} must be (B, T, H + 2G, D)", qkv.shape().str());
  if (cluster_.options_.kernels.attention == AttentionImpl::unfused)
    return unfused_attention(qkv.shape()[0] * op.heads, qkv.shape()[1], op.window_rows(qkv.shape()[1]),
                             op.head_dim, qkv.dtype(), true);
  const Tensor* tensors[] = {&dout, &qkv, &out, &lse, &dqkv};
  OpArgs args{tensors};
  args.attention = &op;
  fused_attention(op_info("attention_backward"), args, qkv.dtype());
  score_terms(qkv, op, true);
}

void SimBackend::attention_merge(Tensor& out, Tensor& lse, const Tensor& part_out, const Tensor& part_lse) {
  checked_charge("attention_merge", {&out, &lse, &part_out, &part_lse});
}

void SimBackend::fused_attention(const OpInfo& info, const OpArgs& args, DType dtype) {
  const AttentionWork w = op_cost(info, args).attention;
  compute(op_name(info.cost_name),
          cluster_.cost_.attention_window(w.batch_heads, w.seq, w.head_dim, w.causal, w.backward, compute_dtype(dtype),
                                          w.query_begin, w.query_rows, w.sliding_window));
}

void SimBackend::score_terms(const Tensor& qkv, const AttentionOp& op, bool backward) {
  if (!op.bias.defined() && !op.mask.defined()) return;
  const double bytes = attention_score_term_bytes(qkv.shape()[0], op.heads, qkv.shape()[1], op.bias.dtype(),
                                                  op.bias.defined(), op.mask.defined(), backward);
  compute(op_name("attention_score_terms"), cluster_.cost_.memory_bound(bytes, "attention_score_terms"));
}

void SimBackend::unfused_attention(std::int64_t bh, std::int64_t seq, std::int64_t rows, std::int64_t head_dim,
                                   DType dtype, bool backward) {
  const sim::CostModel& cost = cluster_.cost_;
  const sim::DType t = compute_dtype(dtype);
  const double elem = static_cast<double>(dtype_size(dtype));
  // The (rows, s) scores of the query window against every key (rows = s without one); the
  // unfused kernels compute the masked half of a causal matrix too.
  const double scores = static_cast<double>(bh) * static_cast<double>(rows) * seq;  // b·a·rows·s
  const bool dropout = cluster_.options_.kernels.dropout > 0;
  // One (rows, s) by (s, d) or (rows, d) by (d, s) product per sequence and head.
  const sim::Time scores_gemm = cost.gemm(rows, seq, head_dim, t, bh);   // q·kᵀ or dO·Vᵀ
  const sim::Time context_gemm = cost.gemm(rows, head_dim, seq, t, bh);  // P·v, Pᵀ·dO, dS·K, dSᵀ·Q
  if (!backward) {
    compute(op_name("attention_scores"), scores_gemm);
    compute(op_name("attention_softmax"), cost.memory_bound(2 * elem * scores));
    if (dropout) compute(op_name("attention_dropout"), cost.memory_bound((2 * elem + 1) * scores));
    compute(op_name("attention_context"), context_gemm);
    return;
  }
  compute(op_name("attention_context_backward"), context_gemm);  // dV
  compute(op_name("attention_scores_backward"), scores_gemm);    // dP
  if (dropout)
    compute(op_name("attention_dropout_backward"), cost.memory_bound((2 * elem + 1) * scores));
  compute(op_name("attention_softmax_backward"), cost.memory_bound(3 * elem * scores));
  compute(op_name("attention_query_key_backward"), cost.gemm(rows, head_dim, seq, t, 2 * bh));  // dQ, dK
}

bool SimBackend::unfused_cross_entropy(const Tensor& logits,
                                       std::initializer_list<std::pair<const char*, double>> passes) {
  if (cluster_.options_.kernels.cross_entropy != CrossEntropyImpl::unfused) return false;
  const double count = static_cast<double>(logits.numel());
  for (const auto& [name, bytes_per_logit] : passes)
    if (bytes_per_logit > 0) compute(op_name(name), cluster_.cost_.memory_bound(bytes_per_logit * count));
  return true;
}

namespace {
// The unfused loss's cast between the logits' `e`-byte type and its fp32 copy, in bytes per logit (read one,
// write the other); fp32 logits need none.
double cast_bytes(const Tensor& logits) {
  const double e = static_cast<double>(dtype_size(logits.dtype()));
  return e < 4 ? e + 4 : 0;
}
}  // namespace

void SimBackend::cross_entropy_max(const Tensor& logits, Tensor& row_max) {
  check(logits, "cross_entropy_max"), check(row_max, "cross_entropy_max");
  if (unfused_cross_entropy(logits, {{"cross_entropy_float", cast_bytes(logits)}, {"cross_entropy_max", 4}})) return;
  charge(op_info("cross_entropy_max"), {&logits, &row_max});
}
void SimBackend::cross_entropy_partials(const Tensor& logits, const Tensor& targets,
                                        const Tensor& row_max, std::int64_t, Tensor& sumexp,
                                        Tensor& target_logit) {
  check_all("cross_entropy_partials", {&logits, &targets, &row_max, &sumexp, &target_logit});
  if (unfused_cross_entropy(logits, {{"cross_entropy_shift", 8},
                                     {"cross_entropy_exp", 8},
                                     {"cross_entropy_sum", 4},
                                     {"cross_entropy_softmax", 8}}))
    return;
  charge(op_info("cross_entropy_partials"), {&logits, &targets, &row_max, &sumexp, &target_logit});
}
void SimBackend::cross_entropy_loss(const Tensor& row_max, const Tensor& sumexp,
                                    const Tensor& target_logit, Tensor& losses) {
  checked_charge("cross_entropy_loss", {&row_max, &losses}, {&row_max, &sumexp, &target_logit, &losses});
}
void SimBackend::cross_entropy_accuracy(const Tensor& row_max, const Tensor& target_logit, Tensor& correct,
                                        bool) {
  checked_charge("cross_entropy_accuracy", {&row_max, &correct}, {&row_max, &target_logit, &correct});
}
void SimBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                        const Tensor& row_max, const Tensor& sumexp, std::int64_t,
                                        float, Tensor& dlogits) {
  check_all("cross_entropy_backward", {&logits, &targets, &row_max, &sumexp, &dlogits});
  if (unfused_cross_entropy(logits, {{"cross_entropy_scale_backward", 8}, {"cross_entropy_cast_backward", cast_bytes(logits)}}))
    return;
  charge(op_info("cross_entropy_backward"), {&logits, &targets, &row_max, &sumexp, &dlogits});
}

void SimBackend::clip_coefficient(const Tensor& sumsq, float, Tensor& coef) {
  checked_charge("clip_coefficient", {&sumsq, &coef});
}
void SimBackend::adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const Tensor& coef,
                       const AdamWOp&) {
  checked_charge("adamw", {&param, &grad, &m, &v}, {&param, &grad, &m, &v, &coef});
}

}  // namespace meshtrain
