#include "engine/calibrate/workload_shapes.h"

#include <algorithm>

#include "backends/backend_wrapper.h"
#include "backends/sim/sim_backend.h"
#include "engine/step/training_engine.h"
#include "models/model_io.h"
#include "models/moe_routing.h"
#include "simulator/cluster_spec.h"

namespace meshtrain::calibrate {

namespace {

// (rows, last dimension) of a tensor, as measure.cc's make_op builds it.
std::pair<std::int64_t, std::int64_t> matrix(const Tensor& t) {
  const std::int64_t cols = t.shape().rank() > 0 ? t.shape().back() : 1;
  return {cols > 0 ? t.numel() / cols : 0, cols};
}

// Records the shape of every op calibration measures: GEMMs and attention by
// their own shapes, the memory-bound and host ops as the op table says.
class ShapeRecorder final : public BackendWrapper {
 public:
  ShapeRecorder(Backend& target, WorkloadShapes& out) : BackendWrapper(target), out_(out) {}

  // An MoE layer's experts, as one grouped shape: calibration times the grouped kernel as a whole, which
  // is what the simulator looks up (the wrapper's default would show one plain GEMM per expert instead).
  void grouped_gemm(const std::vector<Tensor>& a, const std::vector<Tensor>& b, std::vector<Tensor>& c,
                    const GemmOp& op) override {
    if (!a.empty() && a.size() == c.size()) record_grouped(a, c, op);
    target().grouped_gemm(a, b, c, op);
  }

 private:
  void on_op(const OpInfo& op, const OpArgs& args, const Call& call) override {
    if (op.name == "gemm") record_gemm(args);
    else if (op.name == "attention_forward") record_attention(args);
    else if (measured_per_op(op.cls)) record_op(op, args);
    call();
  }
  void record_gemm(const OpArgs& args) {
    const Tensor &a = *args.tensors[0], &c = *args.tensors[2];
    const auto [rows, cols] = matrix(c);
    const auto [a_rows, a_cols] = matrix(a);
    const GemmOp& g = *args.gemm;
    out_.gemm.insert({rows, cols, g.trans_a ? a_rows : a_cols, g.trans_a, g.trans_b, a.dtype(), c.dtype()});
  }
  // Groups of a_g (rows_g, k) into c_g (rows_g, n), or with op.trans_a the weight gradients c_g (k, n);
  // rows per group as their mean, rounded up (uniform routing gives every expert the same rows, ±1).
  void record_grouped(const std::vector<Tensor>& a, const std::vector<Tensor>& c, const GemmOp& op) {
    std::int64_t rows = 0;
    for (const Tensor& t : a) rows += matrix(t).first;
    const auto groups = static_cast<std::int64_t>(a.size());
    const std::int64_t k = matrix(a.front()).second, n = matrix(c.front()).second;
    out_.grouped.insert({groups, (rows + groups - 1) / groups, n, k, op.trans_a, a.front().dtype(), c.front().dtype()});
  }
  void record_attention(const OpArgs& args) {
    const Tensor& qkv = *args.tensors[0];
    const AttentionOp& a = *args.attention;
    const std::int64_t seq = qkv.shape()[1];
    AttentionShape s{qkv.shape()[0], a.heads, seq, a.head_dim, a.causal, 0, qkv.dtype()};
    if (a.bias.defined() || a.mask.defined()) s.windows = a.mask.defined() ? a.mask.numel() / (seq * seq) : 1;
    out_.attention.insert(s);
  }
  // As measure.cc measures the op under its cost name (the op table's sample at (rows, cols, dtype)).
  void record_op(const OpInfo& op, const OpArgs& args) {
    const std::string name(op.cost_name);
    const Tensor& key = *args.tensors[op.shape_of];
    if (op.grid == Grid::scalar) return void(out_.ops.insert({name, 1, 1, DType::f32}));
    if (op.grid == Grid::rows) return void(out_.ops.insert({name, key.numel(), 1, DType::f32}));
    if (measured_flat(op)) {
      // A multi-tensor op runs as one pass over all its tensors: measured as one flat tensor of their total
      // size (the per-tensor form of such an op too), at its first tensor's dtype.
      const std::size_t fixed = op.traffic.size() - op.repeat, group = op.repeat > 0 ? op.repeat : 1;
      std::int64_t n = 0;
      DType dtype = DType::f32;
      for (std::size_t i = op.repeat > 0 ? fixed : op.shape_of; i < args.tensors.size(); i += group) {
        if (n == 0) dtype = args.tensors[i]->dtype();
        n += args.tensors[i]->numel();
        if (op.repeat == 0) break;
      }
      return void(out_.ops.insert({name, 1, n, dtype}));
    }
    const auto [rows, cols] = matrix(key);
    out_.ops.insert({name, rows, cols, key.dtype()});
  }
  // Whether calibration measures op's cost name through a multi-tensor op.
  static bool measured_flat(const OpInfo& op) {
    for (const OpInfo* m : per_op_measured())
      if (m->cost_name == op.cost_name) return m->repeat > 0;
    return false;
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
    std::vector<int> ranks(static_cast<std::size_t>(tp));
    for (int r = 0; r < tp; ++r) ranks[static_cast<std::size_t>(r)] = r;
    MT_ASSIGN(auto cluster, SimCluster::create(spec, tp, ranks, {}));
    StepOptions options;
    options.initialize_parameters = false;  // nothing to compute: the sim backend holds no values
    // Nor routers' choices: without a routing model every expert would receive no rows. Uniform is the
    // balance simulate assumes by default, so the expert GEMMs recorded are the ones it costs.
    if (model_io(m, seq).routes_to_experts) options.moe_routing = std::make_shared<MoeRouting>(MoeRouting::uniform());
    const std::vector<HostBatch> batches(1, example_batch(m, p.micro_batch, p.effective_seq_len(m)));
    // The sim backend blocks on nothing, so each rank issues its whole step in turn.
    for (int r : ranks) {
      ShapeRecorder recorder(cluster->backend(r), out);
      TrainingEngine engine(recorder, m, p, options);
      auto step = engine.step(batches, 1e-4f, 1);
      if (!step) return std::move(step).error();
    }
  }
  return ok_status();
}

}  // namespace meshtrain::calibrate
