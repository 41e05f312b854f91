// The backend interface: what one rank of a training job can ask of a device.
//
// The engine and the models issue work only through this header; the cpu
// (reference), cuda and sim (shape-only, timed) backends implement it. This
// header knows nothing of parallel plans, schedules or models, and names none
// of its implementations.
//
// Contract shared by every implementation:
//  * One Backend object serves one rank. It is NOT thread-safe: exactly one host
//    thread issues work on it. Different ranks (threads of one process, or
//    processes) each own their own Backend and may issue concurrently.
//  * Every op is asynchronous with respect to the host: it is enqueued on the
//    current stream (see set_stream) and may run later. Ops on one stream run
//    in issue order; ops on different streams are ordered only by events.
//    An implementation may run ops eagerly (the cpu backend does): callers must
//    not rely on either behaviour. Only the methods marked BLOCKS wait for data.
//  * Tensors are owned by the backend that created them; a Tensor is a shared
//    handle, and the storage is freed when the last handle (or view) goes away,
//    after every op already issued on it has finished. Passing a tensor of one
//    backend to another is an error.
//  * Inputs are `const Tensor&`, outputs `Tensor&`; outputs must be allocated by
//    the caller with the documented shape. Outputs never alias inputs unless
//    the op says "in place".
//  * Gradient convention: gradients of parameters ACCUMULATE (+=) so that
//    micro-batches sum into one gradient buffer; gradients of activations
//    OVERWRITE.
//  * Shapes in comments use one legend: N rows (tokens = B·T), B batch, T
//    sequence, C model width, H query heads, G kv heads, D head dim, F ffn
//    width, V vocabulary (or this rank's vocabulary shard), K inner dim (or,
//    for mixture-of-experts ops, experts per token), E experts.
//    A tensor of rank > 2 passed where (N, X) is documented is viewed as
//    (numel / X, X).
//  * Misuse (wrong shapes, dtypes, foreign tensors) is a programming error and
//    aborts with a message; user-facing validation happens before ops are issued.
//  * Failures that happen while work runs (a collective that times out, a peer
//    that died, a device error) are sticky, as CUDA's are: the failing op and
//    every later op become no-ops and the error is returned by the next
//    blocking call (read, synchronize). The error names the op, group and peers.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/fp8.h"
#include "core/status.h"

namespace meshtrain {

enum class DType : std::uint8_t { f32, bf16, f16, i32 };

std::size_t dtype_size(DType t);
std::string_view dtype_name(DType t);

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<std::int64_t> dims) : dims_(std::move(dims)) {}
  int rank() const { return static_cast<int>(dims_.size()); }
  std::int64_t operator[](int i) const { return dims_[static_cast<std::size_t>(i)]; }
  std::int64_t back() const { return dims_.back(); }
  std::int64_t numel() const;
  const std::vector<std::int64_t>& dims() const { return dims_; }
  std::string str() const;  // "(2, 64, 128)"
  bool operator==(const Shape&) const = default;

 private:
  std::vector<std::int64_t> dims_;
};

// Backend-owned storage. Each backend derives its own (host buffer, device
// pointer, or nothing at all for sim) and downcasts handles it created.
class Storage {
 public:
  virtual ~Storage() = default;
};

// A contiguous view of backend storage: `numel()` elements starting at
// `offset()` elements into the storage. Cheap to copy (one shared_ptr).
class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Storage> storage, Shape shape, DType dtype, std::int64_t offset = 0)
      : storage_(std::move(storage)), shape_(std::move(shape)), dtype_(dtype), offset_(offset) {}

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  std::int64_t offset() const { return offset_; }
  Storage* storage() const { return storage_.get(); }

  // Same elements, another shape of equal numel.
  Tensor view(Shape shape) const;
  // Elements [begin, begin+count) of the flattened tensor, as `shape`
  // (default: 1-D). Used for flat parameter/gradient buffers and buckets.
  Tensor slice(std::int64_t begin, std::int64_t count, Shape shape = {}) const;
  // Rows [begin, begin+count) along dimension 0.
  Tensor rows(std::int64_t begin, std::int64_t count) const;

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::f32;
  std::int64_t offset_ = 0;
};

// Streams and events are small handles issued by one backend.
struct Stream {
  int id = 0;
  bool operator==(const Stream&) const = default;
};
struct Event {
  std::int64_t id = -1;
  bool valid() const { return id >= 0; }
};

// A group of global ranks taking part in a collective. `ranks` is sorted
// ascending and includes the calling rank; `id` is unique per group within a
// job, the same on every member (the mesh assigns it).
struct Group {
  int id = 0;
  std::vector<int> ranks;
  int size() const { return static_cast<int>(ranks.size()); }
  int index_of(int global_rank) const;  // -1 if not a member
};

enum class ReduceOp : std::uint8_t { sum, max };

struct GemmOp {
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;  // c = alpha * op(a) op(b) + beta * c
  Tensor bias{};      // optional (n): added to every row of the product
};

// An FP8 cast as Transformer Engine makes one of a GEMM operand (models/fp8_linear.h):
// y = round_to_fp8(x · scale) / scale, and amax (1) = max(amax, max |x|); under
// current scaling (`current`) the scale comes from amax instead.
struct Fp8CastOp {
  float scale = 1.f;
  Fp8Format format = Fp8Format::e4m3;
  // The FP8 copies a device run writes, for the cost only (y holds the values
  // once, in its own dtype, as the emulation keeps them): 2 where an operand
  // is first cast, the cast and its transpose (Hopper's FP8 GEMMs read an
  // activation, a gradient and a weight in both layouts: TE's
  // cast_transpose); 0 where the emulation casts again what a real run kept
  // (the forward's input and weight, read back by the backward GEMMs).
  int copies = 2;
  // Current scaling (core/fp8.h, Fp8Recipe::current): the scale is
  // current_scale(amax, format) of the amax tensor passed in, which holds
  // this tensor's amax (Backend::amax, reduced over the ranks that hold
  // parts of it), and amax is left as it is; `scale` is not read.
  bool current = false;
};

struct AttentionOp {
  int heads = 0;      // H query heads on this rank
  int kv_heads = 0;   // G kv heads on this rank; H % G == 0 (grouped-query)
  int head_dim = 0;   // D
  float scale = 0.f;  // usually 1/sqrt(D)
  // Decoders mask the future (query t reads keys 0..t); encoders (ViT, Swin)
  // read every key of their sequence.
  bool causal = true;
  // Optional additive terms on the scores s = scale · q kᵀ, before the softmax
  // (Swin's window attention; undefined tensors: none):
  //  * bias (T, T, H), f32 or the qkv dtype: bias[i][j][h] is added to the
  //    score of query i and key j in head h, in every batch entry (a relative
  //    position bias, gathered from its table by index).
  //  * mask (W, T, T) f32, constant: batch entry b adds mask[b mod W] to every
  //    head (the shifted-window mask: 0 within a region, large negative
  //    across). W must divide B.
  //  * dbias (T, T, H) f32, written by attention_backward only (overwritten):
  //    the gradient of the loss with respect to bias, summed over the batch,
  //    in a fixed order. A handle to a caller-allocated output; attention
  //    backward with a bias must be given one.
  Tensor bias{}, mask{}, dbias{};
  // A query window (context parallelism, models/context_parallel.h): only
  // the query rows [query_begin, query_begin + query_rows) of qkv's T are
  // computed, against every key (causal: a query at row t reads keys 0..t,
  // rows being positions). out (B, query_rows, H, D) and lse (B, H,
  // query_rows) hold the window's rows; in backward dout is the window's and
  // dqkv (B, T, H + 2G, D) gets zero query gradients outside it. 0 rows: the
  // whole sequence. Not combined with bias or mask.
  std::int64_t query_begin = 0, query_rows = 0;
  // Sliding-window attention (Mistral, Gemma 2, gpt-oss; causal only): the
  // query at row t reads only keys t - sliding_window + 1 .. t. 0: every key
  // up to t. Rows are positions, so a query window (above) masks alike.
  std::int64_t sliding_window = 0;
  // Attention sinks as gpt-oss trains them: sinks (H) f32, one learned logit
  // per query head that joins every row's softmax denominator and carries no
  // value, so a head can attend to "nothing". lse includes it. dsinks (H)
  // f32, attention_backward only: the gradient, ADDED into (the caller zeroes
  // or accumulates). Undefined tensors: no sinks.
  Tensor sinks{}, dsinks{};
  std::int64_t window_rows(std::int64_t T) const { return query_rows > 0 ? query_rows : T; }
};

struct AdamWOp {
  float lr = 0.f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.f;  // decoupled, multiplied by lr
  std::int64_t step = 1;     // 1-based, for bias correction
  // > 0: v is frozen (not updated) and bias-corrected as at this step, as
  // 1-bit Adam freezes it after its warm-up (Tang et al. 2021); 0: AdamW.
  std::int64_t variance_frozen_at = 0;
};

// Counter-based dropout: the mask of element i is a pure function of
// (seed, offset + i), so backward regenerates it instead of storing it and a
// shard of a tensor (offset = its first element) draws the same mask as the
// whole tensor would.
struct DropoutOp {
  float p = 0.f;
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;
};

// One parameter of a multi-tensor AdamW step (Backend::foreach_adamw).
struct AdamWTensors {
  Tensor param, grad, m, v;  // fp32, same numel; param, m and v are updated in place
  float weight_decay = 0.f;  // this parameter's, in place of AdamWOp::weight_decay
};

// Counter-based normal initialisation (Backend::init_normal). x is viewed as
// (rows, cols); columns [col, col + width) of row r draw the counters
// counter + r·row_stride + (0 .. width-1). Runs are disjoint; elements no run
// covers (a shard's padding) are 0.
struct NormalInitOp {
  std::uint64_t key = 0;  // the stream (one per parameter)
  double stddev = 1.0;
  std::int64_t cols = 0;
  std::uint64_t row_stride = 0;
  struct Run {
    std::int64_t col = 0, width = 0;
    std::uint64_t counter = 0;
  };
  std::vector<Run> runs;
};

struct MemoryStats {
  std::int64_t live_bytes = 0;  // bytes of live tensor storage now
  std::int64_t peak_bytes = 0;  // max of live_bytes since the last reset_peak
  // The same for host memory (Backend::host_zeros), never counted above.
  std::int64_t host_live_bytes = 0;
  std::int64_t host_peak_bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;
  virtual int rank() const = 0;        // global rank of this backend
  virtual int world_size() const = 0;
  // Whether the backend computes values (cpu, cuda), or only shapes, costs
  // and memory (sim): where an op's output is there only for its cost (an
  // FP8 cast, models/fp8_linear.h), a caller may then let it alias its input
  // and keep the memory a run without it would hold.
  virtual bool holds_values() const { return true; }

  // ---- memory --------------------------------------------------------------
  // Uninitialised storage of `shape` (sim: no storage, only bookkeeping).
  virtual Tensor empty(const Shape& shape, DType dtype = DType::f32) = 0;
  // Storage of `shape` holding zeros: empty + fill(0) unless an implementation
  // has zeroed memory at hand (the cpu backend's fresh pages: nothing is written).
  virtual Tensor zeros(const Shape& shape, DType dtype = DType::f32);
  virtual MemoryStats memory_stats() const = 0;
  virtual void reset_peak() = 0;  // device and host peaks

  // ---- host memory (optimizer and parameter offload, ZeRO-Offload) ---------
  // Zeroed storage of `shape` in the host's memory instead of the device's:
  // page-locked on cuda (so copies to and from it are asynchronous DMA), a
  // pool of its own on cpu, bookkeeping on sim. Counted in MemoryStats'
  // host_* fields, never in live/peak. Only these ops take a host tensor:
  //  * copy, with either side on the host: the bytes cross the host link
  //    (PCIe); cuda copies asynchronously on the current stream, sim times it
  //    on the GPU's PCIe link;
  //  * write and read, as for device tensors;
  //  * foreach_adamw when every tensor of every entry is on the host but the
  //    clip coefficient: the update then runs on the host's cores
  //    (multi-threaded and vectorized, in stream order: it starts when the
  //    work issued before it on the current stream is done, and later work
  //    waits for it), giving the cpu backend's bits; sim times it at the
  //    host's calibrated AdamW rate.
  // Any other op given a host tensor is misuse (the cpu backend checks this
  // too, though its host and device memory are the same RAM).
  virtual Tensor host_zeros(const Shape& shape, DType dtype = DType::f32) = 0;

  // ---- host transfer -------------------------------------------------------
  // Enqueue a copy of host data into `dst` (converted to dst's dtype). The host
  // span may be reused as soon as the call returns.
  virtual void write(Tensor& dst, std::span<const float> host) = 0;
  virtual void write(Tensor& dst, std::span<const std::int32_t> host) = 0;
  // BLOCKS until every op issued so far on the current stream has finished,
  // then copies `src` (converted to float) into `host` (size src.numel()).
  // sim: fills zeros.
  virtual Status read(const Tensor& src, std::span<float> host) = 0;

  // ---- streams and events --------------------------------------------------
  // Stream 0 is the default compute stream; communication usually gets its own.
  virtual Stream create_stream(std::string_view name) = 0;
  virtual void set_stream(Stream s) = 0;
  virtual Stream current_stream() const = 0;
  // Records an event at the current position of stream `s`.
  virtual Event record(Stream s) = 0;
  // Later work on stream `s` waits until `e` has happened. Does not block the host.
  virtual void wait(Stream s, Event e) = 0;
  // BLOCKS until all work issued on every stream has finished.
  virtual Status synchronize() = 0;
  // Attributes what is issued from now on (until the next call) to a named
  // part of the iteration, e.g. a plan's segment or a boundary between two;
  // returns the previous name. The sim backend reports compute time and
  // bytes sent per region (SimRankReport); the others ignore it.
  virtual std::string set_region(std::string name) {
    (void)name;
    return {};
  }

  // Counter-based initialisation: x (any float dtype) = stddev · normal_at(key,
  // counter) for each element a run of `op` covers, rounded to x's dtype, 0
  // elsewhere; normal_at is backends/counter_rng.h's double-precision draw,
  // and an implementation gives exactly its fp32 values (the default: drawn on
  // the host with normal_at itself, then written).
  virtual void init_normal(Tensor& x, const NormalInitOp& op);

  // ---- timing (optional) ---------------------------------------------------
  // Device time of the work on a stream (per-rank step timing,
  // engine/training/step_timing.h): timed_event(s) marks the current position of
  // stream `s`; seconds_between(a, b) BLOCKS until `b` has happened and
  // returns the device seconds from `a` to `b`. A backend that runs ops on
  // the host as they are issued (cpu) has no device time of its own and
  // keeps these defaults, an invalid Event and an Error: callers then time
  // with the host clock.
  virtual Event timed_event(Stream s) {
    (void)s;
    return Event{};
  }
  virtual Result<double> seconds_between(Event start, Event end) {
    (void)start, (void)end;
    return make_error("the {} backend has no device timing", name());
  }

  // ---- elementwise and small ops (current stream) ----------------------------
  virtual void fill(Tensor& x, float value) = 0;
  virtual void copy(const Tensor& src, Tensor& dst) = 0;  // same dtype and numel
  virtual void cast(const Tensor& src, Tensor& dst) = 0;  // same numel, any float dtypes
  virtual void add(const Tensor& a, const Tensor& b, Tensor& out) = 0;  // out may alias a or b
  virtual void scale(Tensor& x, float alpha) = 0;                        // in place
  virtual void axpy(float alpha, const Tensor& x, Tensor& y) = 0;        // y += alpha * x
  // out (1) = scale * sum(x), or += when accumulate.
  virtual void sum(const Tensor& x, Tensor& out, float scale, bool accumulate) = 0;
  // out (1) = sum(x^2) in fp32 (+= when accumulate). Building block of global norms.
  virtual void sum_squares(const Tensor& x, Tensor& out, bool accumulate) = 0;
  // y (x's shape) = x on op's FP8 grid (Fp8CastOp); amax (1, f32) = max(amax, max |x|),
  // or, with op.current, the amax that sets the scale.
  virtual void fp8_cast(const Tensor& x, const Fp8CastOp& op, Tensor& y, Tensor& amax) = 0;
  // out (1, f32) = max(out, max |x|): FP8 current scaling's pass over a tensor before its cast.
  virtual void amax(const Tensor& x, Tensor& out) = 0;

  // ---- dense ---------------------------------------------------------------
  // c (m, n) = alpha * op(a) op(b) + beta * c [+ bias]; a (m,k) or (k,m) when
  // trans_a; b (k,n) or (n,k) when trans_b.
  virtual void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) = 0;
  // The same for each of L matrices: a (L, m, k), b (L, k, n), c (L, m, n).
  virtual void batched_gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOp& op) = 0;
  // One grouped GEMM: c[g] = alpha · op(a[g]) op(b[g]) + beta · c[g] for every
  // group g, shapes as gemm's, the groups' rows uneven (an MoE layer's
  // experts over their tokens, as Megatron-Core's GroupedMLP runs them in one
  // kernel). The default issues one gemm per group (the same bits); the sim
  // backend times the groups as one grouped kernel.
  virtual void grouped_gemm(const std::vector<Tensor>& a, const std::vector<Tensor>& b, std::vector<Tensor>& c,
                            const GemmOp& op);
  // db (n) += column sums of dy (m, n): the gradient of a fused bias.
  virtual void bias_backward(const Tensor& dy, Tensor& db) = 0;

  // ---- embedding -----------------------------------------------------------
  // out (N, C) = table[ids - vocab_offset] for ids owned by this shard
  // (vocab_offset <= id < vocab_offset + V), zero rows otherwise.
  virtual void embedding_forward(const Tensor& table, const Tensor& ids, Tensor& out,
                                 std::int64_t vocab_offset) = 0;
  // dtable (V, C) += scatter of dout (N, C) by ids; deterministic (no float atomics).
  virtual void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable,
                                  std::int64_t vocab_offset) = 0;

  // ---- index maps ------------------------------------------------------------
  // out (N, X) row i = src (M, X) row index[i], or a zero row where index[i]
  // < 0; index (N) i32, src and out of one dtype. Rearranges activations by a
  // map built once on the host: patch extraction, Swin's window partition
  // and cyclic shift and their inverses, patch merging's 2×2 concatenation
  // (with zero padding). A bijective map's backward is the gather by the
  // inverse map; sums over repeated indices are embedding_backward's.
  virtual void gather_rows(const Tensor& src, const Tensor& index, Tensor& out) = 0;

  // ---- mixture of experts -------------------------------------------------------
  // A token's path through its experts: the router (moe_route), a gather of
  // its rows into expert order (gather_rows), all_to_all to the ranks that
  // hold the experts and back, and the weighted sum of its experts' outputs
  // (moe_combine). The dispatch's backward sums a token's gradients with
  // embedding_backward (a scatter-add by token index in a fixed order).
  //
  // Router: logits (N, E) f32 -> probs (N, E) f32, the softmax over the E
  // experts; lse (N) f32 its log-sum-exp; experts (N, K) i32 the K most
  // probable experts in descending order of probability (ties: the lower
  // expert first); weights (N, K) f32 their probabilities, divided by their
  // sum when `renormalize` (Mixtral), as they are otherwise (Switch).
  virtual void moe_route(const Tensor& logits, bool renormalize, Tensor& probs, Tensor& lse, Tensor& weights,
                         Tensor& experts) = 0;
  // dlogits (N, E) f32, overwritten: the gradient with respect to the
  // logits of  Σ dweights ⊙ weights  +  Σ_{n,e} prob_grad[e] · probs[n, e]
  // +  z_scale · Σ_n lse[n]²  — the combine's weights, a load-balancing loss
  // (linear in the probabilities once the token counts are fixed) and the
  // router z-loss. dweights (N, K) f32, prob_grad (E) f32; probs, lse and
  // experts as moe_route wrote them.
  virtual void moe_route_backward(const Tensor& dweights, const Tensor& probs, const Tensor& lse,
                                  const Tensor& experts, const Tensor& prob_grad, float z_scale, bool renormalize,
                                  Tensor& dlogits) = 0;
  // out (N, C) row n = Σ_k weights[n, k] · rows[index[n, k]] over k = 0..K-1
  // in that order (fp32 accumulation), skipping slots with index < 0 (a
  // dropped token's expert); a token with every slot skipped gets a zero row.
  // index (N, K) i32, weights (N, K) f32, rows (M, C) and out of one dtype.
  // Each row of `rows` is read by at most one slot.
  virtual void moe_combine(const Tensor& rows, const Tensor& index, const Tensor& weights, Tensor& out) = 0;
  // Its backward, both overwritten: drows (M, C) row index[n, k] =
  // weights[n, k] · dout[n], zero for rows that no slot reads; dweights
  // (N, K) f32 = dout[n] · rows[index[n, k]], 0 for skipped slots.
  virtual void moe_combine_backward(const Tensor& dout, const Tensor& rows, const Tensor& index,
                                    const Tensor& weights, Tensor& drows, Tensor& dweights) = 0;

  // ---- normalisation ---------------------------------------------------------
  // x (N, C), weight/bias (C), out (N, C), mean/rstd (N) saved for backward.
  virtual void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                 Tensor& out, Tensor& mean, Tensor& rstd, float eps) = 0;
  virtual void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                  Tensor& dweight, Tensor& dbias) = 0;
  virtual void rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& out, Tensor& rstd,
                               float eps) = 0;
  virtual void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                const Tensor& rstd, Tensor& dx, Tensor& dweight) = 0;

  // ---- activations -----------------------------------------------------------
  // GELU, tanh approximation (as GPT-2).
  virtual void gelu_forward(const Tensor& x, Tensor& out) = 0;
  virtual void gelu_backward(const Tensor& dout, const Tensor& x, Tensor& dx) = 0;
  // x (N, 2F) = [gate | up] per row; out (N, F) = silu(gate) * up.
  virtual void swiglu_forward(const Tensor& x, Tensor& out) = 0;
  virtual void swiglu_backward(const Tensor& dout, const Tensor& x, Tensor& dx) = 0;
  virtual void dropout_forward(const Tensor& x, Tensor& out, const DropoutOp& op) = 0;
  virtual void dropout_backward(const Tensor& dout, Tensor& dx, const DropoutOp& op) = 0;

  // ---- attention -------------------------------------------------------------
  // Rotary position embedding, in place, on the first `rotate_heads` heads of
  // x (B, T, heads_total, D): pairs (2i, 2i+1) of each head rotate by angle
  // (first_position + t) · theta^(-2i/D). `inverse` rotates back: that is the
  // backward of rope. A chunk of a sequence (context parallelism) passes its
  // first token's position and rotates as the whole sequence would.
  virtual void rope(Tensor& x, int heads_total, int rotate_heads, float theta, bool inverse,
                    std::int64_t first_position) = 0;
  // qkv (B, T, H + 2G, D) holds per token the H query heads, then G key heads,
  // then G value heads. out (B, T, H, D) = softmax(q kᵀ · scale [+ causal
  // mask] [+ bias] [+ mask]) v (AttentionOp), query head h reading kv head
  // h / (H / G). lse (B, H, T) fp32: per-row log-sum-exp saved for backward.
  virtual void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse,
                                 const AttentionOp& op) = 0;
  // dqkv (B, T, H + 2G, D), overwritten.
  virtual void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                  const Tensor& lse, Tensor& dqkv, const AttentionOp& op) = 0;
  // Ring attention's merge of a partial result over more keys into a running
  // one (models/context_parallel.h): out (B, Q, H, D) and lse (B, H, Q) f32,
  // in place, become the attention over the keys of both, from part_out and
  // part_lse of the same shapes: lse' = log(e^lse + e^part_lse), out' =
  // e^(lse - lse')·out + e^(part_lse - lse')·part_out. Backward needs no op
  // of its own: attention_backward of each part, given the merged out and
  // lse, gives that part's exact share of the gradients. The default reads
  // both to the host, merges there and writes back (BLOCKS); backends that
  // run ring attention fast override it.
  virtual void attention_merge(Tensor& out, Tensor& lse, const Tensor& part_out, const Tensor& part_lse);

  // ---- softmax cross-entropy, vocab-parallel in phases -------------------------
  // The vocabulary may be sharded over tensor-parallel ranks (this rank holds
  // columns [vocab_offset, vocab_offset + V)). The caller combines row
  // statistics across shards between phases (all-reduce max, then sum); with
  // one shard the phases run back to back. The full logits are never gathered.
  //   logits (N, V), targets (N) i32, row_max/sumexp/target_logit/losses (N).
  virtual void cross_entropy_max(const Tensor& logits, Tensor& row_max) = 0;
  // sumexp = Σ_v exp(logit - row_max); target_logit = logit[target] if this
  // shard owns the target, else 0.
  virtual void cross_entropy_partials(const Tensor& logits, const Tensor& targets,
                                      const Tensor& row_max, std::int64_t vocab_offset,
                                      Tensor& sumexp, Tensor& target_logit) = 0;
  // losses = log(sumexp) + row_max - target_logit.
  virtual void cross_entropy_loss(const Tensor& row_max, const Tensor& sumexp,
                                  const Tensor& target_logit, Tensor& losses) = 0;
  // dlogits = dloss · (softmax(logits) - onehot(target)), overwritten; the
  // softmax uses the global row_max and sumexp.
  virtual void cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                      const Tensor& row_max, const Tensor& sumexp,
                                      std::int64_t vocab_offset, float dloss,
                                      Tensor& dlogits) = 0;

  // correct (1) = number of rows whose target logit is the largest of the
  // row (target_logit >= row_max, both after the caller combined the shards),
  // or += when accumulate. Classification accuracy without gathering logits.
  virtual void cross_entropy_accuracy(const Tensor& row_max, const Tensor& target_logit, Tensor& correct,
                                      bool accumulate) = 0;

  // ---- optimizer -------------------------------------------------------------
  // coef (1) = min(1, max_norm / (sqrt(sumsq) + 1e-6)): the clip coefficient
  // from a global sum of squares, computed on the device so the host need not wait.
  virtual void clip_coefficient(const Tensor& sumsq, float max_norm, Tensor& coef) = 0;
  // AdamW on fp32 param/m/v with grad · coef (coef (1) from clip_coefficient,
  // undefined Tensor for no clipping). param, m, v in place.
  virtual void adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                     const Tensor& coef, const AdamWOp& op) = 0;

  // ---- multi-tensor versions: one op over many tensors (a gradient bucket's) --
  // Each gives exactly the bits of the per-tensor calls it replaces (the
  // default implementations make those calls); an implementation runs them as
  // one pass, the cpu backend as one parallel loop.
  // out (1) += Σ x² of xs[0], then of xs[1], ...: sum_squares(xs[i], out, true) in order.
  virtual void foreach_sum_squares(std::span<const Tensor> xs, Tensor& out);
  // adamw(t.param, t.grad, t.m, t.v, coef, op with t.weight_decay) for each t.
  virtual void foreach_adamw(std::span<const AdamWTensors> params, const Tensor& coef,
                             const AdamWOp& op);

  // ---- 1-bit gradient compression (error feedback) ------------------------------
  // Sign compression, as 1-bit Adam and EF-SGD send gradients. x (C, k) f32
  // is C chunks of k elements; error (C, k) f32 is the compression error each
  // rank keeps, or an undefined Tensor for none. Per chunk c:
  //   y = x[c] + error[c];  scale = mean |y| (Σ in double, in element order;
  //   the scale that minimises ‖y − scale·sign(y)‖₂);  sign(y) = +1 where
  //   y >= 0, else −1;  error[c] = y − scale·sign(y) (in place).
  // packets (C, 1 + ceil(k/32)) i32, overwritten: word 0 of a row holds the
  // scale's fp32 bits, bit i of word 1 + j the sign of element 32j + i (1:
  // +1); bits past k are 0. A row is what one rank sends for one chunk.
  virtual void sign_compress(const Tensor& x, Tensor& error, Tensor& packets) = 0;
  // out (C, k) f32 = scale · sign of each element of packets (C, 1 + ceil(k/32)), overwritten.
  virtual void sign_decompress(const Tensor& packets, Tensor& out) = 0;

  // ---- collectives (on the current stream; issued in the same order by every
  // member of the group). Reductions combine contributions in ascending rank
  // order, so results are bitwise deterministic. -----------------------------
  virtual void all_reduce(Tensor& x, const Group& g, ReduceOp op) = 0;  // in place
  // in (g.size() · n) -> out (n): this member's block of the reduction.
  virtual void reduce_scatter(const Tensor& in, Tensor& out, const Group& g, ReduceOp op) = 0;
  // in (n) -> out (g.size() · n), blocks in group order.
  virtual void all_gather(const Tensor& in, Tensor& out, const Group& g) = 0;
  virtual void broadcast(Tensor& x, const Group& g, int root_global_rank) = 0;  // in place
  // Uneven all-to-all over flat tensors: send_counts[i] elements go to member
  // i, recv_counts[i] arrive from member i, packed in member order.
  virtual void all_to_all(const Tensor& in, std::span<const std::int64_t> send_counts,
                          Tensor& out, std::span<const std::int64_t> recv_counts,
                          const Group& g) = 0;
  // The same two over a tensor of FP8 values (an fp8_cast's output,
  // models/fp8_linear.h), which Transformer Engine moves at one byte an
  // element. A backend without an 8-bit type moves the 16-bit values (the
  // same values: the cast rounded them to the FP8 grid); one that times the
  // wire (the sim) counts one byte an element. The all-gather's
  // `fp8_elements` of out's elements are FP8 values, the rest 16-bit (a
  // parameter bucket of FP8 weights and others, Plan::fp8_param_gather;
  // out.numel() for a cast).
  virtual void all_gather_fp8(const Tensor& in, Tensor& out, const Group& g, std::int64_t fp8_elements) {
    (void)fp8_elements;
    all_gather(in, out, g);
  }
  virtual void all_to_all_fp8(const Tensor& in, std::span<const std::int64_t> send_counts, Tensor& out,
                              std::span<const std::int64_t> recv_counts, const Group& g) {
    all_to_all(in, send_counts, out, recv_counts, g);
  }
  // Point to point; a send pairs with the recv of the same (peer, tag).
  virtual void send(const Tensor& x, int peer_global_rank, int tag) = 0;
  virtual void recv(Tensor& x, int peer_global_rank, int tag) = 0;
  // One step of a ring: `out` to `to` and `in` from `from`, posted together.
  // Every rank of a ring sends before it receives; where a send holds its
  // stream until the peer's receive starts (NCCL), posting them apart would
  // wait forever, so the cuda backend groups the two.
  virtual void send_recv(const Tensor& out, int to, Tensor& in, int from, int tag) {
    send(out, to, tag);
    recv(in, from, tag);
  }
  virtual void barrier(const Group& g) = 0;
};

// Issues work on `s` for the lifetime of the scope, then restores the stream.
class StreamScope {
 public:
  StreamScope(Backend& b, Stream s) : b_(b), prev_(b.current_stream()) { b_.set_stream(s); }
  ~StreamScope() { b_.set_stream(prev_); }
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  Backend& b_;
  Stream prev_;
};

}  // namespace meshtrain
