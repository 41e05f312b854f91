// The op set as data: one entry per op of backends/backend.h that does work
// on a device, saying what the op is called, what its operands are, how it
// is costed and how to call it on small operands.
//
// Everything that used to list the ops by hand derives from this table:
//  * the sim backend's costs (backends/sim/sim_ops.cc asks op_cost for the
//    FLOPs, bytes and cost class of each call instead of its own formula);
//  * calibration's measurement list and its op calls (engine/calibrate/:
//    every op of a measured cost class, driven through its sample at
//    calibration sizes, its bytes counted by the same op_cost the simulator
//    uses, so a lookup by the simulated bytes finds the measured entries);
//  * trace and profile names (the cost name: the multi-tensor ops under the
//    name of the op they repeat), through BackendWrapper's one hook
//    (backends/backend_wrapper.h);
//  * which ops take host memory (backends/misuse.h).
// The Backend's typed virtual methods stay: a backend implements kernels,
// and cannot lack one (each is a pure virtual of backend.h). An op this table
// lacks stops at its first call through the sim backend or a BackendWrapper
// (op_info names it); tests/backends/op_table_test.cc walks the table and
// fails if an entry lacks a name, operands, a cost or a sample, or if a
// sample does not run on the cpu and sim backends (cuda where present).
//
// Adding an op: its virtual in backend.h (and BackendWrapper's forward), an
// entry here with its sample, the cpu and cuda kernels, the sim method's one
// charge() call, and a test of its values.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <string_view>
#include <vector>

#include "backends/backend.h"
#include "core/status.h"

namespace meshtrain {

// How the simulator times an op, and whether calibration measures it.
enum class CostClass : std::uint8_t {
  gemm,        // matrix products: FLOPs at the device's GEMM efficiency (calibrated by shape)
  attention,   // fused attention: FLOPs at its efficiency (calibrated by shape)
  memory,      // memory-bound on the device: bytes read and written (calibrated per op by bytes)
  host,        // on the host's cores over host memory (offloaded optimizer; calibrated per op)
  collective,  // a collective over a group: the nccl-tests size of its buffer
  p2p,         // a point-to-point message
};
std::string_view cost_class_name(CostClass c);
// Whether `meshtrain calibrate` times every op of this class on its own
// (gemm and attention are measured by shape, collectives by group size).
bool measured_per_op(CostClass c);

// One (batch ×) m×k by k×n product.
struct MatmulDims {
  std::int64_t batch = 1, m = 0, n = 0, k = 0;
};
// Fused attention over batch·heads sequences, as the simulator costs it.
struct AttentionWork {
  std::int64_t batch_heads = 0, seq = 0, head_dim = 0;
  bool causal = true, backward = false;
  std::int64_t query_begin = 0, query_rows = 0, sliding_window = 0;
};

struct OpCost {
  CostClass cls = CostClass::memory;
  double flops = 0;                 // arithmetic (gemm and attention; 0 where the op is bound by memory)
  double bytes = 0;                 // bytes moved: memory traffic, or a collective's nccl-tests size
  std::vector<MatmulDims> matmuls;  // gemm: one per product (grouped_gemm: one per group)
  AttentionWork attention;          // attention
};

// The operands of one call: its tensors in the order the entry's `operands`
// names them (an undefined optional tensor moves no bytes), and what a cost
// needs beyond shapes.
struct OpArgs {
  std::span<const Tensor* const> tensors;
  const GemmOp* gemm = nullptr;            // gemm ops (transposes; not needed for the cost)
  const AttentionOp* attention = nullptr;  // attention ops
  double share = 1.0;                      // rope: the share of the heads it rotates
  std::int64_t exchanged = 0;              // all_to_all: the larger of elements sent and received
  const Fp8CastOp* fp8_cast = nullptr;     // fp8_cast: the FP8 copies a device writes
};

// Calibration's size of a memory-bound or host op: rows × cols elements
// (per `OpInfo::grid`) with activations at `dtype`.
struct SampleShape {
  std::int64_t rows = 4, cols = 8;
  DType dtype = DType::f32;
};
// A call of the op on operands the sample built on one backend, and its cost
// there. `run` may be called many times (calibration times it).
struct OpSample {
  std::function<void()> run;
  OpCost cost;
};

// The sizes calibration's grid measures an op at.
enum class Grid : std::uint8_t {
  matrix,  // (rows, cols) activations, a log-spaced range of element counts
  rows,    // per-row statistics only: (rows, 1)
  scalar,  // one element
};

struct OpInfo {
  using CostFn = OpCost (*)(const OpInfo&, const OpArgs&);
  using SampleFn = Result<OpSample> (*)(Backend& b, const SampleShape& shape);
  std::string_view name;       // the Backend method
  std::string_view cost_name;  // its task, trace, profile and calibration name
  CostClass cls;
  // The tensors, in OpArgs order, with backend.h's shape legend.
  std::string_view operands;
  // memory and host classes: how many times each tensor's bytes move (reads
  // plus writes; 0: read one row per index, counted with the output). The
  // last `repeat` weights apply again to every further group of tensors (the
  // multi-tensor ops). Other classes cost by their own function.
  std::vector<std::uint8_t> traffic = {};
  std::uint8_t repeat = 0;
  bool host_memory = false;  // takes tensors in host memory (Backend::host_zeros)
  Grid grid = Grid::matrix;
  // The operand whose (rows, last dimension) and dtype calibration's
  // workload recorder keeps for the op (engine/calibrate/workload_shapes.cc).
  std::uint8_t shape_of = 0;
  CostFn cost = nullptr;  // null: by traffic
  // Builds operands of `shape` on `b` (activations at shape.dtype, statistics
  // and optimizer state f32, as the step keeps them) and calls the op;
  // collectives run on the one-member group of b's rank.
  SampleFn sample = nullptr;
  // The Backend method, where the entry is a variant of one under its own
  // name (host_adamw: foreach_adamw on host memory); empty: `name`.
  std::string_view method = {};
};

// Every op, in backend.h's order.
const std::vector<OpInfo>& op_table();
// The entry of Backend method `name`, or null.
const OpInfo* find_op(std::string_view name);
// The entry of `name`; a name not in the table is a programming error (aborts).
const OpInfo& op_info(std::string_view name);
// The entries calibration measures one by one (measured_per_op classes),
// one per cost name: of the ops sharing one, the multi-tensor form the step
// issues (foreach_adamw for "adamw").
std::vector<const OpInfo*> per_op_measured();

// The cost of a call with `args`.
OpCost op_cost(const OpInfo& op, const OpArgs& args);
inline OpCost op_cost(const OpInfo& op, std::initializer_list<const Tensor*> tensors) {
  return op_cost(op, OpArgs{std::span<const Tensor* const>(tensors.begin(), tensors.size())});
}

// The bytes a fused attention's score terms (AttentionOp bias and mask) add:
// each of the B·H·T·T scores reads its bias (its dtype) and mask (f32) term;
// backward also writes each score's gradient and reads it again for the sum
// into dbias (f32).
double attention_score_term_bytes(std::int64_t batch, std::int64_t heads, std::int64_t seq, DType bias_dtype, bool bias,
                                  bool mask, bool backward);

}  // namespace meshtrain
