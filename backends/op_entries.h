// What the table's entry files (op_entries_*.cc) share: the operand
// builders of the samples and the cost functions of the classes that do not
// cost by traffic. Internal to backends/op_table.*.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "backends/op_table.h"

namespace meshtrain::op_entries {

void append_compute(std::vector<OpInfo>& table);   // elementwise, dense, embedding, MoE, norms, attention
void append_training(std::vector<OpInfo>& table);  // loss, optimizer, compression, communication

// The cost functions of the ops that do not cost by traffic (op_table.cc).
OpCost gemm_cost(const OpInfo& op, const OpArgs& args);
OpCost batched_gemm_cost(const OpInfo& op, const OpArgs& args);
OpCost grouped_gemm_cost(const OpInfo& op, const OpArgs& args);
OpCost attention_forward_cost(const OpInfo& op, const OpArgs& args);
OpCost attention_backward_cost(const OpInfo& op, const OpArgs& args);
OpCost all_to_all_cost(const OpInfo& op, const OpArgs& args);
OpCost barrier_cost(const OpInfo& op, const OpArgs& args);
OpCost fp8_cast_cost(const OpInfo& op, const OpArgs& args);
// A collective's or message's nccl-tests size: the bytes of operand I (all-reduce and broadcast the
// buffer, reduce-scatter its input, all-gather its output, point to point the message).
template <std::size_t I>
OpCost operand_bytes_cost(const OpInfo& op, const OpArgs& args) {
  const Tensor* t = args.tensors[I];
  return OpCost{op.cls, 0, t->defined() ? static_cast<double>(t->bytes()) : 0.0, {}, {}};
}
MatmulDims matmul_of(const Tensor& a, const Tensor& c);

// A tensor of `shape` holding `value`.
inline Tensor filled(Backend& b, const Shape& shape, float value, DType dtype = DType::f32) {
  Tensor x = b.empty(shape, dtype);
  b.fill(x, value);
  return x;
}
// n token ids spread over [0, vocab).
inline Tensor ids(Backend& b, std::int64_t n, std::int64_t vocab) {
  Tensor x = b.empty(Shape{n}, DType::i32);
  std::vector<std::int32_t> host(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    host[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7919) % std::max<std::int64_t>(vocab, 1));
  b.write(x, host);
  return x;
}
// The sample of op `name`: `run`, costed on `tensors` (in the entry's operand order) and `args`' extras.
inline OpSample sampled(std::string_view name, std::function<void()> run, std::initializer_list<const Tensor*> tensors,
                        OpArgs args = {}) {
  args.tensors = std::span<const Tensor* const>(tensors.begin(), tensors.size());
  return OpSample{std::move(run), op_cost(op_info(name), args)};
}
// The one-member group of b's rank.
inline Group self_group(const Backend& b) { return Group{0, {b.rank()}}; }

}  // namespace meshtrain::op_entries
