// The table's lookup and its cost functions; the entries themselves are in
// op_entries_*.cc, grouped as backend.h groups the ops.
#include "backends/op_table.h"

#include <algorithm>
#include <unordered_map>
#include <string>

#include "backends/misuse.h"
#include "backends/op_entries.h"
#include "simulator/calibration.h"
#include "simulator/cost_model.h"

namespace meshtrain {

std::string_view cost_class_name(CostClass c) {
  switch (c) {
    case CostClass::gemm: return "gemm";
    case CostClass::attention: return "attention";
    case CostClass::memory: return "memory";
    case CostClass::host: return "host";
    case CostClass::collective: return "collective";
    case CostClass::p2p: return "p2p";
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
    if (same == out.end()) out.push_back(&op);
    else if (op.repeat > 0) *same = &op;
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
      if (op.repeat == 0) abort_misuse("op table", fmt::format("{}: {} tensors, {} expected", op.name,
                                                                tensors.size(), op.traffic.size()));
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

double attention_score_term_bytes(std::int64_t batch, std::int64_t heads, std::int64_t seq, DType bias_dtype,
                                  bool bias, bool mask, bool backward) {
  const double scores = static_cast<double>(batch) * static_cast<double>(heads) * static_cast<double>(seq) *
                        static_cast<double>(seq);
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

OpCost gemm_cost(const OpInfo& op, const OpArgs& args) {
  const auto t = args.tensors;  // a, b, c, bias
  OpCost c{op.cls, 0, 0, {}, {}};
  const bool batched = op.name == "batched_gemm";
  // grouped_gemm: a, b, c per group; gemm and batched_gemm one (a, b, c, bias).
  const std::size_t stride = op.name == "grouped_gemm" ? 3 : t.size();
  for (std::size_t g = 0; g + 2 < t.size(); g += stride) {
    const Tensor &a = *t[g], &cc = *t[g + 2];
    MatmulDims d = matmul_of(a, cc);
    if (batched && cc.shape().rank() == 3) {
      d = {cc.shape()[0], cc.shape()[1], cc.shape()[2], 0};
      d.k = a.numel() / std::max<std::int64_t>(d.batch * d.m, 1);
    }
    c.matmuls.push_back(d);
    c.flops += 2.0 * static_cast<double>(d.batch) * static_cast<double>(d.m) * static_cast<double>(d.n) *
               static_cast<double>(d.k);
    for (std::size_t i = g; i < std::min(g + stride, t.size()); ++i) c.bytes += bytes_of(t[i]);
  }
  return c;
}

OpCost attention_cost(const OpInfo& op, const OpArgs& args) {
  OpCost c{op.cls, 0, 0, {}, {}};
  const bool backward = op.name == "attention_backward";
  const Tensor& qkv = *args.tensors[backward ? 1 : 0];
  for (const Tensor* t : args.tensors) c.bytes += bytes_of(t);
  if (args.attention == nullptr || qkv.shape().rank() != 4) return c;
  const AttentionOp& a = *args.attention;
  const std::int64_t seq = qkv.shape()[1];
  c.attention = {qkv.shape()[0] * a.heads, seq, a.head_dim, a.causal, backward,
                 a.query_begin, a.query_rows, a.sliding_window};
  const bool windowed = a.query_rows > 0 && a.query_rows < seq;
  const double share = sim::attention_window_share(seq, windowed ? a.query_begin : 0, windowed ? a.query_rows : seq,
                                                   a.causal, a.sliding_window);
  c.flops = (backward ? 2.5 : 1.0) * share *
            sim::attention_flops(c.attention.batch_heads, seq, a.head_dim, a.causal);
  return c;
}

OpCost collective_cost(const OpInfo& op, const OpArgs& args) {
  OpCost c{op.cls, 0, 0, {}, {}};
  const auto t = args.tensors;
  if (op.name == "barrier") c.bytes = 4;  // timed as the one-element all-reduce NCCL would run
  else if (op.name == "all_to_all") c.bytes = static_cast<double>(args.exchanged) * static_cast<double>(dtype_size(t[0]->dtype()));
  else if (op.name == "all_gather") c.bytes = bytes_of(t[1]);  // the gathered output
  else c.bytes = bytes_of(t[0]);  // all-reduce, broadcast: the buffer; reduce-scatter: its input; p2p: the message
  return c;
}

}  // namespace op_entries
}  // namespace meshtrain
