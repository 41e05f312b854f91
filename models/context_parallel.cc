#include "models/context_parallel.h"

#include "models/block_context.h"

namespace meshtrain {

std::string context_comm_name(ContextComm c) { return c == ContextComm::ring ? "ring" : "allgather"; }

Result<ContextComm> parse_context_comm(const std::string& s) {
  if (s == "allgather") return ContextComm::all_gather;
  if (s == "ring") return ContextComm::ring;
  return make_error("unknown context-parallel communication '{}'; use allgather or ring", s);
}

Status check_context_split(std::int64_t seq, int size) {
  if (size <= 1) return ok_status();
  if (seq % (2 * size) != 0)
    return make_error("context parallelism cuts seq_len {} into 2·cp = {} chunks (each rank takes chunk r and "
                      "2·cp-1-r), which does not divide it; use a seq_len that is a multiple of {}",
                      seq, 2 * size, 2 * size);
  return ok_status();
}

std::vector<std::int32_t> context_positions(std::int64_t seq, int size, int rank) {
  const std::int64_t c = seq / (2 * size);
  std::vector<std::int32_t> out;
  out.reserve(static_cast<std::size_t>(2 * c));
  for (const std::int64_t chunk : {static_cast<std::int64_t>(rank), 2 * static_cast<std::int64_t>(size) - 1 - rank})
    for (std::int64_t i = 0; i < c; ++i) out.push_back(static_cast<std::int32_t>(chunk * c + i));
  return out;
}

namespace {

// The shapes of one exchange.
struct Dims {
  std::int64_t B, L, T, c, N, H, G, S;
  std::int64_t local_rows() const { return B * L; }             // N_l
  std::int64_t kv_rows() const { return local_rows() * 2 * G; }  // one rank's K and V rows of width D
};

Dims dims(const BlockContext& ctx, int batch, std::int64_t local_seq, const AttentionOp& op) {
  const std::int64_t N = ctx.options.context.size;
  return {batch, local_seq, local_seq * N, local_seq / 2, N, op.heads, op.kv_heads, op.heads + 2 * op.kv_heads};
}

// Where global position p lives: (rank, local index).
std::pair<std::int64_t, std::int64_t> owner(const Dims& d, std::int64_t p) {
  const std::int64_t chunk = p / d.c, i = p % d.c;
  if (chunk < d.N) return {chunk, i};
  return {2 * d.N - 1 - chunk, d.c + i};
}

std::string key(const char* what, const Dims& d, int rank) {
  return fmt::format("cp:{}:{}:{}:{}:{}:{}:{}", what, d.B, d.L, d.N, d.H, d.G, rank);
}

// (N_l·2G): the K and V head slots of the local qkv rows viewed as (N_l·S, D).
const Tensor& kv_of_local(BlockContext& ctx, const Dims& d, int rank) {
  return ctx.constant_ids(key("kv", d, rank), [&] {
    std::vector<std::int32_t> idx;
    for (std::int64_t n = 0; n < d.local_rows(); ++n)
      for (std::int64_t j = 0; j < 2 * d.G; ++j) idx.push_back(static_cast<std::int32_t>(n * d.S + d.H + j));
    return idx;
  });
}

// (B·T·S): the whole sequence's qkv rows from the exchanged buffer: this
// rank's query slots from its local rows, every K and V slot from the block
// of the rank that owns the token; other ranks' query slots zero (-1).
const Tensor& full_from_exchanged(BlockContext& ctx, const Dims& d, int rank) {
  return ctx.constant_ids(key("full", d, rank), [&] {
    std::vector<std::int32_t> idx;
    const std::int64_t kv_base = d.local_rows() * d.S;
    for (std::int64_t b = 0; b < d.B; ++b)
      for (std::int64_t p = 0; p < d.T; ++p) {
        const auto [r, t] = owner(d, p);
        const std::int64_t n = b * d.L + t;
        for (std::int64_t k = 0; k < d.S; ++k) {
          if (k < d.H) idx.push_back(r == rank ? static_cast<std::int32_t>(n * d.S + k) : -1);
          else idx.push_back(static_cast<std::int32_t>(kv_base + r * d.kv_rows() + n * 2 * d.G + (k - d.H)));
        }
      }
    return idx;
  });
}

// (N·N_l·2G): the K and V gradient slots of the whole sequence's dqkv rows,
// in the exchanged layout (rank-major), for the reduce-scatter back.
const Tensor& kv_grads_by_owner(BlockContext& ctx, const Dims& d, int rank) {
  return ctx.constant_ids(key("kv_grads", d, rank), [&] {
    std::vector<std::int32_t> idx(static_cast<std::size_t>(d.N * d.kv_rows()));
    for (std::int64_t b = 0; b < d.B; ++b)
      for (std::int64_t p = 0; p < d.T; ++p) {
        const auto [r, t] = owner(d, p);
        const std::int64_t n = b * d.L + t;
        for (std::int64_t j = 0; j < 2 * d.G; ++j)
          idx[static_cast<std::size_t>(r * d.kv_rows() + n * 2 * d.G + j)] =
              static_cast<std::int32_t>((b * d.T + p) * d.S + d.H + j);
      }
    return idx;
  });
}

// (N_l·S): the local dqkv rows: query slots from the whole sequence's dqkv
// (the local tokens' rows), K and V slots from the reduced block after it.
const Tensor& local_grads(BlockContext& ctx, const Dims& d, int rank) {
  return ctx.constant_ids(key("local_grads", d, rank), [&] {
    std::vector<std::int32_t> idx;
    const std::vector<std::int32_t> pos = context_positions(d.T, static_cast<int>(d.N), rank);
    const std::int64_t reduced = d.B * d.T * d.S;
    for (std::int64_t b = 0; b < d.B; ++b)
      for (std::int64_t t = 0; t < d.L; ++t) {
        const std::int64_t n = b * d.L + t, p = pos[static_cast<std::size_t>(t)];
        for (std::int64_t k = 0; k < d.S; ++k)
          idx.push_back(static_cast<std::int32_t>(k < d.H ? (b * d.T + p) * d.S + k
                                                          : reduced + n * 2 * d.G + (k - d.H)));
      }
    return idx;
  });
}

// (N_l) attention rows of the local tokens from the two chunks' outputs (2·B·c rows, chunk-major), and back.
const Tensor& local_from_chunks(BlockContext& ctx, const Dims& d, bool inverse) {
  return ctx.constant_ids(key(inverse ? "chunks_of_local" : "local_of_chunks", d, 0), [&] {
    std::vector<std::int32_t> idx(static_cast<std::size_t>(d.local_rows()));
    for (std::int64_t w = 0; w < 2; ++w)
      for (std::int64_t b = 0; b < d.B; ++b)
        for (std::int64_t i = 0; i < d.c; ++i) {
          const std::int64_t chunk_row = (w * d.B + b) * d.c + i, local_row = b * d.L + w * d.c + i;
          if (inverse) idx[static_cast<std::size_t>(chunk_row)] = static_cast<std::int32_t>(local_row);
          else idx[static_cast<std::size_t>(local_row)] = static_cast<std::int32_t>(chunk_row);
        }
    return idx;
  });
}

// The K and V blocks of every rank into `all` (N blocks of `mine`'s size, group order).
void exchange_kv(BlockContext& ctx, const Tensor& mine, Tensor& all) {
  const ContextParallel& cp = ctx.options.context;
  Backend& b = ctx.b;
  if (cp.comm == ContextComm::all_gather) return b.all_gather(mine, all, cp.group);
  // Ring: step s passes block (rank - s) on to the next rank and takes block (rank - s - 1) from the previous.
  const std::int64_t n = mine.numel();
  const int N = cp.size, next = cp.group.ranks[static_cast<std::size_t>((cp.rank + 1) % N)],
            prev = cp.group.ranks[static_cast<std::size_t>((cp.rank + N - 1) % N)];
  Tensor own = all.slice(cp.rank * n, n);
  b.copy(mine, own);
  for (int s = 0; s < N - 1; ++s) {
    const int send_block = (cp.rank - s + N) % N, recv_block = (cp.rank - s - 1 + N) % N;
    b.send(all.slice(send_block * n, n), next, kContextRingTag + s);
    Tensor in = all.slice(recv_block * n, n);
    b.recv(in, prev, kContextRingTag + s);
  }
}

// Every rank's K and V gradient blocks (`all`, group order) summed into this rank's block (`mine`).
void reduce_kv_grads(BlockContext& ctx, const Tensor& all, Tensor& mine) {
  const ContextParallel& cp = ctx.options.context;
  Backend& b = ctx.b;
  if (cp.comm == ContextComm::all_gather) return b.reduce_scatter(all, mine, cp.group, ReduceOp::sum);
  // Ring reduce-scatter: step s sends the running sum of block (rank - s - 1) on; after N - 1 steps
  // each rank holds its own block summed over every rank (in ring order from its successor).
  const std::int64_t n = mine.numel();
  const int N = cp.size, next = cp.group.ranks[static_cast<std::size_t>((cp.rank + 1) % N)],
            prev = cp.group.ranks[static_cast<std::size_t>((cp.rank + N - 1) % N)];
  Tensor partial = b.empty(Shape{n}, mine.dtype()), incoming = b.empty(Shape{n}, mine.dtype());
  b.copy(all.slice(((cp.rank - 1 + N) % N) * n, n), partial);
  for (int s = 0; s < N - 1; ++s) {
    b.send(partial, next, kContextRingTag + N + s);
    b.recv(incoming, prev, kContextRingTag + N + s);
    const int block = (cp.rank - s - 2 + 2 * N) % N;
    partial = b.empty(Shape{n}, mine.dtype());
    b.add(incoming, all.slice(block * n, n), partial);
  }
  b.copy(partial, mine);
}

// The whole sequence's (B, T, S, D) qkv, rotated, from the exchanged buffer.
Tensor whole_sequence(BlockContext& ctx, const Dims& d, const Tensor& exchanged, const AttentionOp& op,
                      float rope_theta) {
  Tensor full = ctx.b.empty(Shape{d.B * d.T * d.S, op.head_dim}, ctx.act);
  ctx.b.gather_rows(exchanged, full_from_exchanged(ctx, d, ctx.options.context.rank), full);
  Tensor full4 = full.view(Shape{d.B, d.T, d.S, op.head_dim});
  if (rope_theta > 0) ctx.b.rope(full4, static_cast<int>(d.S), static_cast<int>(d.H + d.G), rope_theta, false);
  return full4;
}

AttentionOp chunk_op(const AttentionOp& base, const Dims& d, int rank, int w) {
  AttentionOp op = base;
  const std::int64_t chunk = w == 0 ? rank : 2 * d.N - 1 - rank;
  op.query_begin = chunk * d.c;
  op.query_rows = d.c;
  return op;
}

}  // namespace

Tensor context_attention_forward(BlockContext& ctx, int batch, std::int64_t local_seq, const Tensor& qkv,
                                 const AttentionOp& op, float rope_theta, ContextAttentionSaved& saved) {
  Backend& b = ctx.b;
  const int rank = ctx.options.context.rank;
  const Dims d = dims(ctx, batch, local_seq, op);
  const std::int64_t D = op.head_dim, local = d.local_rows() * d.S;
  // [local qkv rows | every rank's K, V rows]: what backward rebuilds the whole sequence from.
  saved.exchanged = b.empty(Shape{local + d.N * d.kv_rows(), D}, ctx.act);
  Tensor own = saved.exchanged.rows(0, local);
  b.copy(qkv.view(Shape{local, D}), own);
  Tensor kv = b.empty(Shape{d.kv_rows(), D}, ctx.act);
  b.gather_rows(own, kv_of_local(ctx, d, rank), kv);
  Tensor all = saved.exchanged.rows(local, d.N * d.kv_rows());
  exchange_kv(ctx, kv, all);
  const Tensor full = whole_sequence(ctx, d, saved.exchanged, op, rope_theta);
  saved.out = b.empty(Shape{2 * d.B * d.c, d.H * D}, ctx.act);
  saved.lse = b.empty(Shape{2, d.B, d.H, d.c});
  for (int w = 0; w < 2; ++w) {
    Tensor out = saved.out.rows(w * d.B * d.c, d.B * d.c).view(Shape{d.B, d.c, d.H, D});
    Tensor lse = saved.lse.slice(w * d.B * d.H * d.c, d.B * d.H * d.c, Shape{d.B, d.H, d.c});
    b.attention_forward(full, out, lse, chunk_op(op, d, rank, w));
  }
  Tensor attn = b.empty(Shape{d.local_rows(), d.H * D}, ctx.act);
  b.gather_rows(saved.out, local_from_chunks(ctx, d, false), attn);
  return attn;
}

Tensor context_attention_backward(BlockContext& ctx, int batch, std::int64_t local_seq, const Tensor& dattn,
                                  const AttentionOp& op, float rope_theta, const ContextAttentionSaved& saved) {
  Backend& b = ctx.b;
  const int rank = ctx.options.context.rank;
  const Dims d = dims(ctx, batch, local_seq, op);
  const std::int64_t D = op.head_dim, whole = d.B * d.T * d.S;
  const Tensor full = whole_sequence(ctx, d, saved.exchanged, op, rope_theta);
  Tensor dchunks = b.empty(Shape{2 * d.B * d.c, d.H * D}, ctx.act);
  b.gather_rows(dattn.view(Shape{d.local_rows(), d.H * D}), local_from_chunks(ctx, d, true), dchunks);
  // [the whole sequence's dqkv | this rank's reduced K, V gradients]: the local gradient's sources.
  Tensor grads = b.empty(Shape{whole + d.kv_rows(), D}, ctx.act);
  Tensor dfull = grads.rows(0, whole).view(Shape{d.B, d.T, d.S, D});
  Tensor scratch = b.empty(Shape{d.B, d.T, d.S, D}, ctx.act);
  for (int w = 0; w < 2; ++w) {
    const std::int64_t rows = d.B * d.c;
    const Tensor dout = dchunks.rows(w * rows, rows).view(Shape{d.B, d.c, d.H, D});
    const Tensor out = saved.out.rows(w * rows, rows).view(Shape{d.B, d.c, d.H, D});
    const Tensor lse = saved.lse.slice(w * d.B * d.H * d.c, d.B * d.H * d.c, Shape{d.B, d.H, d.c});
    b.attention_backward(dout, full, out, lse, w == 0 ? dfull : scratch, chunk_op(op, d, rank, w));
  }
  b.add(dfull, scratch, dfull);
  scratch = Tensor();
  if (rope_theta > 0) b.rope(dfull, static_cast<int>(d.S), static_cast<int>(d.H + d.G), rope_theta, true);
  Tensor by_owner = b.empty(Shape{d.N * d.kv_rows(), D}, ctx.act);
  b.gather_rows(grads.rows(0, whole), kv_grads_by_owner(ctx, d, rank), by_owner);
  Tensor mine = grads.rows(whole, d.kv_rows());
  reduce_kv_grads(ctx, by_owner, mine);
  Tensor dqkv = b.empty(Shape{d.local_rows() * d.S, D}, ctx.act);
  b.gather_rows(grads, local_grads(ctx, d, rank), dqkv);
  return dqkv.view(Shape{d.local_rows(), d.S * D});
}

}  // namespace meshtrain
