#include "models/block_context.h"

#include <algorithm>
#include <vector>

#include "models/context_parallel.h"
#include "models/init.h"

namespace meshtrain {

BlockContext::BlockContext(Backend& backend, const ModelSpec& spec, ParameterStore& store, TensorParallel tensor,
                           ChunkOptions chunk_options)
    : b(backend),
      m(spec),
      params(store),
      tp(std::move(tensor)),
      options(chunk_options),
      act(chunk_options.storage.value_dtype),
      sp(chunk_options.sequence_parallel && tp.size > 1) {
  if (m.moe()) {
    moe_.losses = b.empty(Shape{2});
    moe_.clear(b);
  }
}

void MoeStatistics::clear(Backend& b) {
  if (losses.defined()) b.fill(losses, 0.f);
  tokens.clear();
  assignments = dropped = 0;
}

void BlockContext::tp_all_reduce(Tensor& x) {
  if (tp.size > 1) b.all_reduce(x, tp.group, ReduceOp::sum);
}

DropoutOp BlockContext::dropout(const MicroBatch& mb, int layer, int site, std::int64_t rows,
                                std::int64_t width) const {
  const std::uint64_t offset = sp ? static_cast<std::uint64_t>(tp.rank * rows * width) : 0;
  return {options.dropout, mix64(mb.dropout_seed ^ mix64(static_cast<std::uint64_t>(layer + 2) * 8 + site)),
          offset};
}

DropoutOp BlockContext::whole_dropout(const MicroBatch& mb, int layer, std::int64_t rows, std::int64_t width) const {
  DropoutOp op = dropout(mb, layer, 0, rows, width);
  op.offset = 0;
  return op;
}

Tensor BlockContext::all_rows(const Tensor& x, std::int64_t width) {
  const Tensor rows = x.view(Shape{x.numel() / width, width});
  return sp ? sp_gather(rows) : rows;
}

Tensor BlockContext::sp_gather(const Tensor& x, bool fp8_values) {
  const std::int64_t width = x.shape().back();
  Tensor full = b.empty(Shape{x.numel() / width * tp.size, width}, x.dtype());
  tp_gather(x, full, fp8_values);
  return full;
}

void BlockContext::tp_gather(const Tensor& shard, Tensor& full, bool fp8_values) {
  if (fp8_values) b.all_gather_fp8(shard, full, tp.group, full.numel());
  else b.all_gather(shard, full, tp.group);
}

Tensor BlockContext::sp_scatter(const Tensor& x) {
  const std::int64_t width = x.shape().back();
  Tensor shard = b.empty(Shape{x.numel() / width / tp.size, width}, x.dtype());
  b.reduce_scatter(x, shard, tp.group, ReduceOp::sum);
  return shard;
}

Tensor BlockContext::local_part(const Tensor& x) {
  const std::int64_t width = x.shape().back(), rows = x.numel() / width / tp.size;
  Tensor part = b.empty(Shape{rows, width}, x.dtype());
  b.copy(x.view(Shape{rows * tp.size, width}).rows(tp.rank * rows, rows), part);
  return part;
}

void BlockContext::norm_forward(const std::string& prefix, const Tensor& x, Tensor& out, Tensor& mean,
                                Tensor& rstd) {
  const ParamSlot& w = params[prefix + ".weight"];
  const std::int64_t width = w.numel, rows = x.numel() / width;
  out = b.empty(Shape{rows, width}, act);
  rstd = b.empty(Shape{rows});
  const Tensor x2 = x.view(Shape{rows, width});
  if (m.norm == NormKind::layernorm) {
    mean = b.empty(Shape{rows});
    b.layernorm_forward(x2, w.value, params[prefix + ".bias"].value, out, mean, rstd, m.norm_eps);
  } else {
    b.rmsnorm_forward(x2, w.value, out, rstd, m.norm_eps);
  }
}

void BlockContext::norm_backward(const std::string& prefix, const Tensor& dout, const Tensor& x, const Tensor& mean,
                                 const Tensor& rstd, Tensor& dx, bool sharded_rows) {
  const ParamSlot& w = params[prefix + ".weight"];
  const std::int64_t width = w.numel, rows = x.numel() / width;
  dx = b.empty(Shape{rows, width}, act);
  const bool layernorm = m.norm == NormKind::layernorm;
  const bool partial_rows = sp && sharded_rows;
  Tensor dw = w.grad, db = layernorm ? params[prefix + ".bias"].grad : Tensor();
  Tensor partial;  // (C or 2C) this sequence shard's part of the weight (and bias) gradient
  if (partial_rows) {
    partial = b.empty(Shape{(layernorm ? 2 : 1) * width});
    b.fill(partial, 0.f);
    dw = partial.slice(0, width);
    if (layernorm) db = partial.slice(width, width);
  }
  const Tensor x2 = x.view(Shape{rows, width}), dout2 = dout.view(Shape{rows, width});
  if (layernorm) b.layernorm_backward(dout2, x2, w.value, mean, rstd, dx, dw, db);
  else b.rmsnorm_backward(dout2, x2, w.value, rstd, dx, dw);
  if (!partial_rows) return;
  // Each tp rank saw only its rows: the replicated norm's gradient sums the shards' parts.
  b.all_reduce(partial, tp.group, ReduceOp::sum);
  Tensor grad = w.grad;
  b.add(grad, partial.slice(0, width), grad);
  if (layernorm) {
    Tensor bias_grad = params[prefix + ".bias"].grad;
    b.add(bias_grad, partial.slice(width, width), bias_grad);
  }
}

// Which groups split the operand (the groups of its rows and columns that
// hold other parts of the same micro-batch's tensor): context parallelism the
// tokens of every activation and gradient; tensor parallelism a weight, the
// input of a row-parallel layer and the output gradient of a column-parallel
// one (their columns), and under SP a column-parallel input's rows and a
// row-parallel output gradient's (cast on its shard; whole where a bias makes
// the engine gather it first).
// Transformer Engine reduces over tp the two tensors it casts before an FP8
// gather under SP, a column-parallel input and a row-parallel output
// gradient, and gathers their FP8 bytes; so does the engine (linear,
// linear_backward), but for the gradient of a layer with a bias, whose
// bias gradient reads the 16-bit rows: it is gathered first and cast whole,
// the same values, its reduction standing for TE's.
Tensor BlockContext::fp8_operand(const std::string& name, LinearKind kind, Fp8Operand which, const Tensor& x,
                                 Fp8Cast cast) {
  if (!fp8_linear(kind)) return x;
  const bool column = kind == LinearKind::column;
  const bool gathered = sp && ((which == Fp8Operand::input && column) || (which == Fp8Operand::grad && !column));
  const bool tp_split = which == Fp8Operand::weight || gathered || (which == Fp8Operand::input && !column) ||
                        (which == Fp8Operand::grad && column);
  Fp8Split split;
  if (tp_split) split.over.push_back(&tp.group);
  if (gathered) split.by_te.push_back(&tp.group);
  if (which != Fp8Operand::weight) split.over.push_back(&options.context.group);
  return fp8->quantize(name, which, x, cast, split);
}

Tensor BlockContext::fp8_operand(const std::string& name, Fp8Operand which, const Tensor& x, Fp8Cast cast,
                                 const Fp8Split& split) {
  if (fp8 == nullptr) return x;
  return fp8->quantize(name, which, x, cast, split);
}

void BlockContext::linear(const std::string& name, const Tensor& x_fp, Tensor& y, LinearKind kind) {
  const ParamSlot& w = params[name + ".weight"];
  const bool row = kind == LinearKind::row;
  GemmOp op;
  // A row-parallel bias is added once, by tp rank 0, before the all-reduce sums the partial products.
  if (params.contains(name + ".bias") && (!row || tp.rank == 0)) op.bias = params[name + ".bias"].value;
  // FP8 (models/fp8_linear.h): one scale per tensor, elementwise, so quantizing this rank's rows
  // before a gather is quantizing the gathered rows.
  const Tensor weight = fp8_operand(name, kind, Fp8Operand::weight, w.value, Fp8Cast::made);
  const Tensor x_in = fp8_operand(name, kind, Fp8Operand::input, x_fp, Fp8Cast::made);
  const std::int64_t in = weight.shape()[0];
  const bool gather = sp && kind == LinearKind::column;
  if (gather && options.tp_comm_overlap) {
    y = b.empty(Shape{x_in.numel() / in * tp.size, weight.shape()[1]}, act);
    ring_gather_gemm(x_in.view(Shape{x_in.numel() / in, in}), weight, y, op, fp8_linear(kind));
    return;
  }
  // Sequence parallelism: a column-parallel GEMM reads every row, gathered from the shards.
  const Tensor x = gather ? sp_gather(x_in.view(Shape{x_in.numel() / in, in}), fp8_linear(kind)) : x_in;
  const std::int64_t rows = x.numel() / in;
  y = b.empty(Shape{rows, weight.shape()[1]}, act);
  b.gemm(x.view(Shape{rows, in}), weight, y, op);
  if (!row) return;
  if (sp) y = sp_scatter(y);  // each rank keeps its sequence shard of the sum
  else tp_all_reduce(y);
}

// Step s multiplies the shard of rank - s, which arrived at step s - 1 (or is
// this rank's own), while it travels on to the next rank and the shard of
// rank - s - 1 comes in: the all-gather's tp-1 ring steps hide under tp-1 of
// the tp row-block GEMMs. A ring step is an all-to-all over the tp group
// whose only counts are to the next rank and from the previous one: the
// send and the receive then run together (NCCL groups them; a ring of plain
// sends then receives on one stream would wait on itself there), and the
// side stream orders the steps, so a shard is forwarded only after it arrived.
void BlockContext::ring_gather_gemm(const Tensor& x, const Tensor& w, Tensor& y, const GemmOp& op, bool fp8_values) {
  const std::int64_t R = x.shape()[0], width = x.shape()[1];
  const auto next = static_cast<std::size_t>((tp.rank + 1) % tp.size);
  const auto prev = static_cast<std::size_t>((tp.rank + tp.size - 1) % tp.size);
  std::vector<std::int64_t> send_counts(static_cast<std::size_t>(tp.size), 0), recv_counts = send_counts;
  send_counts[next] = recv_counts[prev] = R * width;
  Tensor full = b.empty(Shape{R * tp.size, width}, x.dtype());  // (N, in): the shards in rank order
  Tensor own = full.rows(tp.rank * R, R);
  b.copy(x, own);
  const Stream compute = b.current_stream(), comm = tp_stream();
  b.wait(comm, b.record(compute));  // the own shard is in place
  for (int s = 0; s < tp.size; ++s) {
    const int shard = (tp.rank - s + tp.size) % tp.size, incoming = (shard - 1 + tp.size) % tp.size;
    Event arrived;
    if (s < tp.size - 1) {
      StreamScope on_comm(b, comm);
      Tensor in = full.rows(incoming * R, R).view(Shape{R * width});
      const Tensor out = full.rows(shard * R, R).view(Shape{R * width});
      if (fp8_values) b.all_to_all_fp8(out, send_counts, in, recv_counts, tp.group);
      else b.all_to_all(out, send_counts, in, recv_counts, tp.group);
      arrived = b.record(comm);
    }
    Tensor out = y.rows(shard * R, R);
    b.gemm(full.rows(shard * R, R), w, out, op);
    if (s < tp.size - 1) b.wait(compute, arrived);
  }
}

void BlockContext::linear_backward(const std::string& name, const Tensor& x_fp, const Tensor& dy_in, Tensor* dx,
                                   LinearKind kind, Fp8Cast input_cast) {
  const ParamSlot& w = params[name + ".weight"];
  const std::int64_t in = w.value.shape()[0], out = w.value.shape()[1];
  const bool row = kind == LinearKind::row, column = kind == LinearKind::column;
  // Sequence parallelism, the conjugates of forward: a row-parallel output's gradient arrives as
  // the sequence shard and is gathered; a column-parallel input was a shard and is gathered again.
  // FP8: both GEMMs read the E5M2 output gradient, dgrad the weight's and wgrad the input's E4M3
  // casts (the forward's, recomputed: same values, same scales); the bias gradient reads dy in fp32.
  // Under SP the shard is cast and its FP8 bytes gathered, as TE does, unless a bias gradient needs
  // the 16-bit rows (fp8_operand's comment).
  const bool dy_shard = sp && row;
  const Tensor dy_local = dy_in.view(Shape{dy_in.numel() / out, out});
  const bool cast_shard = dy_shard && fp8_linear(kind) && !params.contains(name + ".bias");
  Tensor dy2, dy_q;
  if (cast_shard) {
    dy_q = sp_gather(fp8_operand(name, kind, Fp8Operand::grad, dy_local, Fp8Cast::made), true);
    dy2 = dy_q;  // no bias reads it
  } else {
    dy2 = dy_shard ? sp_gather(dy_local) : dy_local;
    dy_q = fp8_operand(name, kind, Fp8Operand::grad, dy2, Fp8Cast::made);
  }
  const std::int64_t rows = dy2.numel() / out;
  const Tensor weight = fp8_operand(name, kind, Fp8Operand::weight, w.value, Fp8Cast::kept);
  const Tensor x_in = fp8_operand(name, kind, Fp8Operand::input, x_fp, input_cast);
  // tp_comm_overlap: the weight gradient's input is gathered on the side stream under the input
  // gradient's GEMM (a deferred pass gathers its own when it runs).
  Tensor gathered;
  Event gathered_event;
  const bool early_gather = sp && column && options.tp_comm_overlap && deferred_weights == nullptr;
  if (early_gather) {
    const Stream compute = b.current_stream(), comm = tp_stream();
    gathered = b.empty(Shape{rows, in}, x_in.dtype());
    b.wait(comm, b.record(compute));  // after the compute stream's earlier tp collectives
    StreamScope on_comm(b, comm);
    tp_gather(x_in.view(Shape{x_in.numel() / in, in}), gathered, fp8_linear(kind));
    gathered_event = b.record(comm);
  }
  if (dx != nullptr) {
    *dx = b.empty(Shape{rows, in}, act);
    b.gemm(dy_q, weight, *dx, GemmOp{false, true});
  }
  // One tp collective at a time: the input gradient's reduce-scatter follows the gather.
  if (early_gather) b.wait(b.current_stream(), gathered_event);
  if (dx != nullptr) {
    // The input of a column-parallel layer fed every tp rank: its gradient sums their parts.
    if (column) {
      if (sp) *dx = sp_scatter(*dx);
      else tp_all_reduce(*dx);
    }
  }
  // A deferred pass keeps the input as this rank's sequence shard and gathers it when it runs.
  auto weights = [this, name, x_in, gathered, dy2, dy_q, in, rows, column, fp8_values = fp8_linear(kind)] {
    const Tensor x = gathered.defined()              ? gathered
                     : sp && column ? sp_gather(x_in.view(Shape{x_in.numel() / in, in}), fp8_values)
                                    : x_in;
    Tensor dw = params[name + ".weight"].grad;
    b.gemm(x.view(Shape{rows, in}), dy_q, dw, GemmOp{true, false, 1.f, 1.f});
    if (params.contains(name + ".bias")) {
      Tensor db = params[name + ".bias"].grad;
      b.bias_backward(dy2, db);
    }
  };
  if (deferred_weights != nullptr) deferred_weights->push_back(std::move(weights));
  else weights();
}

Tensor BlockContext::vocab_padding_bias(std::int64_t vocab, std::int64_t rows) {
  const std::int64_t first = static_cast<std::int64_t>(tp.rank) * rows;
  const std::int64_t real = std::clamp<std::int64_t>(vocab - first, 0, rows);
  if (real == rows) return Tensor();
  std::vector<float> bias(static_cast<std::size_t>(rows), 0.f);
  std::fill(bias.begin() + real, bias.end(), -1e30f);
  Tensor t = b.empty(Shape{rows}, act);
  b.write(t, bias);
  return t;
}

Tensor BlockContext::cross_entropy(const Tensor& logits, const MicroBatch& mb, std::int64_t vocab_offset,
                                   bool vocab_parallel, Tensor& row_max, Tensor& sumexp) {
  const std::int64_t N = logits.numel() / logits.shape().back();
  const bool combine = vocab_parallel && tp.size > 1;
  row_max = b.empty(Shape{N});
  b.cross_entropy_max(logits, row_max);
  if (combine) b.all_reduce(row_max, tp.group, ReduceOp::max);
  sumexp = b.empty(Shape{N});
  Tensor target_logit = b.empty(Shape{N});
  b.cross_entropy_partials(logits, mb.targets, row_max, vocab_offset, sumexp, target_logit);
  if (combine) {
    b.all_reduce(sumexp, tp.group, ReduceOp::sum);
    b.all_reduce(target_logit, tp.group, ReduceOp::sum);
  }
  Tensor losses = b.empty(Shape{N});
  b.cross_entropy_loss(row_max, sumexp, target_logit, losses);
  if (mb.correct.defined()) {
    Tensor correct = mb.correct;
    b.cross_entropy_accuracy(row_max, target_logit, correct, true);
  }
  Tensor loss_sum = b.empty(Shape{1});
  b.sum(losses, loss_sum, 1.f, false);
  return loss_sum;
}

const Tensor& BlockContext::constant_ids(const std::string& key,
                                         const std::function<std::vector<std::int32_t>()>& build) {
  auto it = constants_.find(key);
  if (it != constants_.end()) return it->second;
  const std::vector<std::int32_t> host = build();
  Tensor t = b.empty(Shape{static_cast<std::int64_t>(host.size())}, DType::i32);
  b.write(t, host);
  return constants_.emplace(key, t).first->second;
}

const Tensor& BlockContext::positions(int batch, int tokens) {
  const ContextParallel& cp = options.context;
  return constant_ids(fmt::format("positions:{}:{}:{}:{}", batch, tokens, cp.size, cp.rank), [&] {
    std::vector<std::int32_t> sequence(static_cast<std::size_t>(tokens));
    if (cp.size > 1) sequence = context_positions(static_cast<std::int64_t>(tokens) * cp.size, cp.size, cp.rank);
    else for (int t = 0; t < tokens; ++t) sequence[static_cast<std::size_t>(t)] = t;
    std::vector<std::int32_t> host;
    for (int b = 0; b < batch; ++b) host.insert(host.end(), sequence.begin(), sequence.end());
    return host;
  });
}

const Tensor& BlockContext::constant_values(const std::string& key, const Shape& shape, DType dtype,
                                            const std::function<std::vector<float>()>& build) {
  auto it = constants_.find(key);
  if (it != constants_.end()) return it->second;
  const std::vector<float> host = build();
  Tensor t = b.empty(shape, dtype);
  b.write(t, host);
  return constants_.emplace(key, t).first->second;
}

Stream BlockContext::tp_stream() {
  if (!tp_stream_) tp_stream_ = b.create_stream("tensor-parallel");
  return *tp_stream_;
}

Stream BlockContext::context_stream() {
  if (!context_stream_) context_stream_ = b.create_stream("context-parallel");
  return *context_stream_;
}

}  // namespace meshtrain
