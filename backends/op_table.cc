// The table's lookup and its cost functions; the entries themselves are in
// op_entries_*.cc, grouped as backend.h groups the ops.
#include "backends/op_table.h"

#include <algorithm>
#include <string>
#include <unordered_map>

#include "backends/misuse.h"
#include "backends/op_entries.h"
#include "simulator/calibration.h"
#include "simulator/cost_model.h"

namespace meshtrain {

std::string_view cost_class_name(CostClass c) {
  switch (c) {
    case CostClass::gemm:
      return "gemm";
    case CostClass::attention:
      return "attention";
    case CostClass::memory:
      return "memory";
    case CostClass::host:
      return "host";
    case CostClass::collective:
      return "collective";
    case CostClass::p2p:
      return "p2p";
  }
  return "?";
}

bool measured_per_op(CostClass c) { return c == CostClass::memory || c == CostClass::host; }

const std::vector<OpInfo>& op_table() {
  static const std::vector<OpInfo> table = [] {
    std::vector<OpInfo> t;
    op_entries::append_compute(t);
    op_entries::append_training(t);
    return t;
  }();
  return table;
}

const OpInfo* find_op(std::string_view name) {
  // The sim backend looks an op up per call: by hash, not by a walk of the table.
  static const std::unordered_map<std::string_view, const OpInfo*> by_name = [] {
    std::unordered_map<std::string_view, const OpInfo*> m;
    for (const OpInfo& op : op_table()) m.emplace(op.name, &op);
    return m;
  }();
  const auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : it->second;
}

bool takes_host_memory(std::string_view op) {
  if (op == "write" || op == "read") return true;  // host transfers, not table ops
  for (const OpInfo& info : op_table())
    if (info.host_memory && (info.name == op || info.method == op)) return true;
  return false;
}

const OpInfo& op_info(std::string_view name) {
  const OpInfo* op = find_op(name);
  if (op == nullptr) abort_misuse("op table", "no op '" + std::string(name) + "' (backends/op_table.h)");
  return *op;
}

std::vector<const OpInfo*> per_op_measured() {
  std::vector<const OpInfo*> out;
  for (const OpInfo& op : op_table()) {
    if (!measured_per_op(op.cls)) continue;
    auto same = std::find_if(out.begin(), out.end(), [&](const OpInfo* o) { return o->cost_name == op.cost_name; });
    // Of the ops one cost name covers, the multi-tensor form: the step issues that one.
    if (same == out.end())
      out.push_back(&op);
    else if (op.repeat > 0)
      *same = &op;
  }
  return out;
}

namespace {

double bytes_of(const Tensor* t) { return t != nullptr && t->defined() ? static_cast<double>(t->bytes()) : 0.0; }

// Σ traffic weight · bytes over the tensors, the last `repeat` weights cycling over the trailing groups.
double traffic_bytes(const OpInfo& op, std::span<const Tensor* const> tensors) {
  const std::size_t fixed = op.traffic.size() - op.repeat;
  double bytes = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    std::size_t w = i;
    if (i >= fixed) {
      if (op.repeat == 0)
        abort_misuse("op table",
                     fmt::format("{}: {} tensors, {} expected", op.name, tensors.size(), op.traffic.size()));
      w = fixed + (i - fixed) % op.repeat;
    }
    bytes += op.traffic[w] * bytes_of(tensors[i]);
  }
  return bytes;
}

}  // namespace

OpCost op_cost(const OpInfo& op, const OpArgs& args) {
  if (op.cost != nullptr) return op.cost(op, args);
  OpCost c;
  c.cls = op.cls;
  c.bytes = traffic_bytes(op, args.tensors) * args.share;
  return c;
}

double attention_score_term_bytes(std::int64_t batch, std::int64_t heads, std::int64_t seq, DType bias_dtype, bool bias,
                                  bool mask, bool backward) {
  const double scores =
      static_cast<double>(batch) * static_cast<double>(heads) * static_cast<double>(seq) * static_cast<double>(seq);
  double bytes = 0;
  if (bias) bytes += scores * static_cast<double>(dtype_size(bias_dtype));
  if (mask) bytes += scores * 4.0;
  if (backward && bias) bytes += 2.0 * scores * 4.0;
  return bytes;
}

namespace op_entries {

// (m, n, k) of c (m, n) = op(a) op(b): the rows and columns of c, and k from a's elements over m.
MatmulDims matmul_of(const Tensor& a, const Tensor& c) {
  const std::int64_t n = c.shape().rank() > 0 ? c.shape().back() : 0, m = c.numel() / std::max<std::int64_t>(n, 1);
  return {1, m, n, a.numel() / std::max<std::int64_t>(m, 1)};
}

namespace {

// One product of `d` over the tensors [first, last) of `t`.
void add_product(OpCost& c, const MatmulDims& d, std::span<const Tensor* const> tensors) {
  c.matmuls.push_back(d);
  c.flops += 2.0 * static_cast<double>(d.batch) * static_cast<double>(d.m) * static_cast<double>(d.n) *
             static_cast<double>(d.k);
  for (const Tensor* t : tensors) c.bytes += bytes_of(t);
}

OpCost attention_cost(const OpInfo& op, const OpArgs& args, bool backward) {
  OpCost c{op.cls, 0, 0, {}, {}};
  const Tensor& qkv = *args.tensors[backward ? 1 : 0];
  for (const Tensor* t : args.tensors) c.bytes += bytes_of(t);
  if (args.attention == nullptr || qkv.shape().rank() != 4) return c;
  const AttentionOp& a = *args.attention;
  const std::int64_t seq = qkv.shape()[1];
  c.attention = {qkv.shape()[0] * a.heads, seq, a.head_dim, a.causal, backward, a.query_begin, a.query_rows,
                 a.sliding_window};
  const bool windowed = a.query_rows > 0 && a.query_rows < seq;
  const double share = sim::attention_window_share(seq, windowed ? a.query_begin : 0, windowed ? a.query_rows : seq,
                                                   a.causal, a.sliding_window);
  c.flops = (backward ? 2.5 : 1.0) * share * sim::attention_flops(c.attention.batch_heads, seq, a.head_dim, a.causal);
  return c;
}

}  // namespace

// a, b, c, bias.
OpCost gemm_cost(const OpInfo& op, const OpArgs& args) {
  OpCost c{op.cls, 0, 0, {}, {}};
  add_product(c, matmul_of(*args.tensors[0], *args.tensors[2]), args.tensors);
  return c;
}

// a (L, m, k), b, c (L, m, n), bias.
OpCost batched_gemm_cost(const OpInfo& op, const OpArgs& args) {
  OpCost c{op.cls, 0, 0, {}, {}};
  const Tensor &a = *args.tensors[0], &out = *args.tensors[2];
  MatmulDims d = matmul_of(a, out);
  if (out.shape().rank() == 3) {
    d = {out.shape()[0], out.shape()[1], out.shape()[2], 0};
    d.k = a.numel() / std::max<std::int64_t>(d.batch * d.m, 1);
  }
  add_product(c, d, args.tensors);
  return c;
}

// a, b, c of each group in turn.
OpCost grouped_gemm_cost(const OpInfo& op, const OpArgs& args) {
  OpCost c{op.cls, 0, 0, {}, {}};
  for (std::size_t g = 0; g + 2 < args.tensors.size(); g += 3)
    add_product(c, matmul_of(*args.tensors[g], *args.tensors[g + 2]), args.tensors.subspan(g, 3));
  return c;
}

OpCost attention_forward_cost(const OpInfo& op, const OpArgs& args) { return attention_cost(op, args, false); }
OpCost attention_backward_cost(const OpInfo& op, const OpArgs& args) { return attention_cost(op, args, true); }

OpCost all_to_all_cost(const OpInfo& op, const OpArgs& args) {
  const double element = static_cast<double>(dtype_size(args.tensors[0]->dtype()));
  return OpCost{op.cls, 0, static_cast<double>(args.exchanged) * element, {}, {}};
}

// NCCL has no barrier: timed as the one-element all-reduce frameworks run.
OpCost barrier_cost(const OpInfo& op, const OpArgs&) { return OpCost{op.cls, 0, 4.0, {}, {}}; }

// A device reads x once and writes one byte per element for each FP8 copy,
// and reads and writes the amax; a cast a real run kept moves nothing.
OpCost fp8_cast_cost(const OpInfo& op, const OpArgs& args) {
  const int copies = args.fp8_cast != nullptr ? args.fp8_cast->copies : 2;
  const Tensor& x = *args.tensors[0];
  if (copies <= 0) return OpCost{op.cls, 0, 0.0, {}, {}};
  const double bytes = static_cast<double>(x.bytes()) + static_cast<double>(copies) * static_cast<double>(x.numel()) +
                       2.0 * static_cast<double>(dtype_size(DType::f32));
  return OpCost{op.cls, 0, bytes, {}, {}};
}

}  // namespace op_entries
}  // namespace meshtrain
