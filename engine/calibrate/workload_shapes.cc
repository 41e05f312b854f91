#include "engine/calibrate/workload_shapes.h"

#include <algorithm>

#include "backends/backend_wrapper.h"
#include "backends/sim/sim_backend.h"
#include "engine/plan/mesh.h"
#include "engine/step/step_engine.h"
#include "models/model_io.h"
#include "simulator/cluster_spec.h"

namespace meshtrain::calibrate {

namespace {

// (rows, last dimension) of a tensor, as measure.cc's make_op builds it.
std::pair<std::int64_t, std::int64_t> matrix(const Tensor& t) {
  const std::int64_t cols = t.shape().rank() > 0 ? t.shape().back() : 1;
  return {cols > 0 ? t.numel() / cols : 0, cols};
}

class ShapeRecorder final : public BackendWrapper {
 public:
  ShapeRecorder(Backend& target, WorkloadShapes& out) : BackendWrapper(target), out_(out) {}

  void fill(Tensor& x, float v) override { op("fill", x), target().fill(x, v); }
  void copy(const Tensor& s, Tensor& d) override { op("copy", s), target().copy(s, d); }
  // By the output's dtype: measure.cc casts into it from the other width.
  void cast(const Tensor& s, Tensor& d) override { op("cast", d), target().cast(s, d); }
  void add(const Tensor& a, const Tensor& b, Tensor& o) override { op("add", a), target().add(a, b, o); }
  void scale(Tensor& x, float a) override { op("scale", x), target().scale(x, a); }
  void axpy(float a, const Tensor& x, Tensor& y) override { op("axpy", x), target().axpy(a, x, y); }
  void sum(const Tensor& x, Tensor& o, float s, bool acc) override { op("sum", x), target().sum(x, o, s, acc); }
  void sum_squares(const Tensor& x, Tensor& o, bool acc) override {
    op("sum_squares", x), target().sum_squares(x, o, acc);
  }
  void bias_backward(const Tensor& dy, Tensor& db) override { op("bias_backward", dy), target().bias_backward(dy, db); }
  void embedding_forward(const Tensor& t, const Tensor& ids, Tensor& o, std::int64_t off) override {
    op("embedding_forward", o), target().embedding_forward(t, ids, o, off);
  }
  void embedding_backward(const Tensor& d, const Tensor& ids, Tensor& dt, std::int64_t off) override {
    op("embedding_backward", d), target().embedding_backward(d, ids, dt, off);
  }
  void gather_rows(const Tensor& s, const Tensor& i, Tensor& o) override {
    op("gather_rows", o), target().gather_rows(s, i, o);
  }
  void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& o, Tensor& m, Tensor& r,
                         float eps) override {
    op("layernorm_forward", x), target().layernorm_forward(x, w, b, o, m, r, eps);
  }
  void layernorm_backward(const Tensor& d, const Tensor& x, const Tensor& w, const Tensor& m, const Tensor& r,
                          Tensor& dx, Tensor& dw, Tensor& db) override {
    op("layernorm_backward", x), target().layernorm_backward(d, x, w, m, r, dx, dw, db);
  }
  void gelu_forward(const Tensor& x, Tensor& o) override { op("gelu_forward", x), target().gelu_forward(x, o); }
  void gelu_backward(const Tensor& d, const Tensor& x, Tensor& dx) override {
    op("gelu_backward", x), target().gelu_backward(d, x, dx);
  }
  void cross_entropy_max(const Tensor& l, Tensor& m) override {
    op("cross_entropy_max", l), target().cross_entropy_max(l, m);
  }
  void cross_entropy_partials(const Tensor& l, const Tensor& t, const Tensor& m, std::int64_t off, Tensor& s,
                              Tensor& tl) override {
    op("cross_entropy_partials", l), target().cross_entropy_partials(l, t, m, off, s, tl);
  }
  void cross_entropy_loss(const Tensor& m, const Tensor& s, const Tensor& tl, Tensor& l) override {
    out_.ops.insert({"cross_entropy_loss", m.numel(), 1}), target().cross_entropy_loss(m, s, tl, l);
  }
  void cross_entropy_backward(const Tensor& l, const Tensor& t, const Tensor& m, const Tensor& s, std::int64_t off,
                              float d, Tensor& dl) override {
    op("cross_entropy_backward", l), target().cross_entropy_backward(l, t, m, s, off, d, dl);
  }
  void cross_entropy_accuracy(const Tensor& m, const Tensor& tl, Tensor& c, bool acc) override {
    out_.ops.insert({"cross_entropy_accuracy", m.numel(), 1}), target().cross_entropy_accuracy(m, tl, c, acc);
  }
  void clip_coefficient(const Tensor& s, float n, Tensor& c) override {
    out_.ops.insert({"clip_coefficient", 1, 1}), target().clip_coefficient(s, n, c);
  }
  void adamw(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const Tensor& c, const AdamWOp& a) override {
    // measure.cc times AdamW on (1, numel) tensors, as the step runs it per parameter.
    out_.ops.insert({"adamw", 1, p.numel()}), target().adamw(p, g, m, v, c, a);
  }
  void sign_compress(const Tensor& x, Tensor& e, Tensor& p) override {
    const auto [rows, cols] = matrix(x);
    out_.ops.insert({"sign_compress", rows, cols}), target().sign_compress(x, e, p);
  }
  void sign_decompress(const Tensor& p, Tensor& o) override {
    const auto [rows, cols] = matrix(o);
    out_.ops.insert({"sign_decompress", rows, cols}), target().sign_decompress(p, o);
  }
  // The multi-tensor forms run as one op over all their tensors: measured as one tensor of their total size.
  void foreach_sum_squares(std::span<const Tensor> xs, Tensor& out) override {
    std::int64_t n = 0;
    for (const Tensor& x : xs) n += x.numel();
    const DType dtype = xs.empty() ? DType::f32 : xs.front().dtype();
    out_.ops.insert({"sum_squares", 1, n, dtype}), target().foreach_sum_squares(xs, out);
  }
  void foreach_adamw(std::span<const AdamWTensors> params, const Tensor& coef, const AdamWOp& a) override {
    std::int64_t n = 0;
    for (const AdamWTensors& t : params) n += t.param.numel();
    out_.ops.insert({"adamw", 1, n}), target().foreach_adamw(params, coef, a);
  }
  void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& g) override {
    const auto [rows, cols] = matrix(c);
    const auto [a_rows, a_cols] = matrix(a);
    out_.gemm.insert({rows, cols, g.trans_a ? a_rows : a_cols, g.trans_a, g.trans_b, a.dtype(), c.dtype()});
    target().gemm(a, b, c, g);
  }
  void attention_forward(const Tensor& qkv, Tensor& o, Tensor& lse, const AttentionOp& a) override {
    const std::int64_t seq = qkv.shape()[1];
    AttentionShape s{qkv.shape()[0], a.heads, seq, a.head_dim, a.causal, 0, qkv.dtype()};
    if (a.bias.defined() || a.mask.defined()) s.windows = a.mask.defined() ? a.mask.numel() / (seq * seq) : 1;
    out_.attention.insert(s);
    target().attention_forward(qkv, o, lse, a);
  }

 private:
  void op(const char* name, const Tensor& t) {
    const auto [rows, cols] = matrix(t);
    out_.ops.insert({name, rows, cols, t.dtype()});
  }
  WorkloadShapes& out_;
};

}  // namespace

Status record_workload_shapes(const ModelSpec& m, std::int64_t micro_batch, std::int64_t seq, Precision precision,
                              WorkloadShapes& out) {
  MT_ASSIGN(sim::ClusterSpec spec, sim::cluster_preset("dgx-a100"));
  for (int tp : {1, 2}) {
    Plan p;
    p.tp = tp;
    p.micro_batch = static_cast<int>(micro_batch);
    p.seq_len = model_io(m, seq).tokens_fixed_by_model ? 0 : static_cast<int>(seq);
    p.precision = precision;  // the dtypes of the step's tensors follow it
    if (tp > 1 && !validate_plan(p, m).ok()) continue;  // a model tp does not split
    MT_TRY(validate_plan(p, m).context(fmt::format("workload {}:{}:{}", m.name, micro_batch, seq)));
    const Mesh mesh(p);
    std::vector<int> ranks(static_cast<std::size_t>(tp));
    for (int r = 0; r < tp; ++r) ranks[static_cast<std::size_t>(r)] = r;
    MT_ASSIGN(auto cluster, SimCluster::create(spec, tp, ranks, {}));
    StepOptions options;
    options.initialize_parameters = false;  // nothing to compute: the sim backend holds no values
    const std::vector<HostBatch> batches(1, example_batch(m, p.micro_batch, p.effective_seq_len(m)));
    // The sim backend blocks on nothing, so each rank issues its whole step in turn.
    for (int r : ranks) {
      ShapeRecorder recorder(cluster->backend(r), out);
      StepEngine engine(recorder, m, p, mesh, options);
      auto step = engine.step(batches, 1e-4f, 1);
      if (!step) return std::move(step).error();
    }
  }
  return ok_status();
}

}  // namespace meshtrain::calibrate
