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

// The global chunk index of local chunk w (0, 1) of rank r.
std::int64_t chunk_of(const Dims& d, std::int64_t r, int w) { return w == 0 ? r : 2 * d.N - 1 - r; }

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

// The local tokens' rows from the two chunks' rows (2·B·c tokens, chunk-major), and back; each token
// one row (attention outputs, per_token 1) or S rows of width D (qkv, per_token S).
const Tensor& local_from_chunks(BlockContext& ctx, const Dims& d, bool inverse, std::int64_t per_token = 1) {
  const std::string name = fmt::format("{}{}", inverse ? "chunks_of_local" : "local_of_chunks", per_token);
  return ctx.constant_ids(key(name.c_str(), d, 0), [&] {
    std::vector<std::int32_t> idx(static_cast<std::size_t>(d.local_rows() * per_token));
    for (std::int64_t w = 0; w < 2; ++w)
      for (std::int64_t b = 0; b < d.B; ++b)
        for (std::int64_t i = 0; i < d.c; ++i)
          for (std::int64_t k = 0; k < per_token; ++k) {
            const std::int64_t chunk_row = ((w * d.B + b) * d.c + i) * per_token + k;
            const std::int64_t local_row = (b * d.L + w * d.c + i) * per_token + k;
            if (inverse) idx[static_cast<std::size_t>(chunk_row)] = static_cast<std::int32_t>(local_row);
            else idx[static_cast<std::size_t>(local_row)] = static_cast<std::int32_t>(chunk_row);
          }
    return idx;
  });
}

// The whole sequence's (B, T, S, D) qkv, rotated, from the exchanged buffer.
Tensor whole_sequence(BlockContext& ctx, const Dims& d, const Tensor& exchanged, const AttentionOp& op,
                      float rope_theta) {
  Tensor full = ctx.b.empty(Shape{d.B * d.T * d.S, op.head_dim}, ctx.act);
  ctx.b.gather_rows(exchanged, full_from_exchanged(ctx, d, ctx.options.context.rank), full);
  Tensor full4 = full.view(Shape{d.B, d.T, d.S, op.head_dim});
  if (rope_theta > 0) ctx.b.rope(full4, static_cast<int>(d.S), static_cast<int>(d.H + d.G), rope_theta, false, 0);
  return full4;
}

AttentionOp chunk_op(const AttentionOp& base, const Dims& d, int rank, int w) {
  AttentionOp op = base;
  op.query_begin = chunk_of(d, rank, w) * d.c;
  op.query_rows = d.c;
  return op;
}


// ---- ring: per-block attention overlapped with the exchange ----------------

// The local qkv rows (N_l·S, D) rotated at their global positions (or back, `inverse`): each of the
// two chunks, gathered contiguous, rotates from its first token's position, so the ring never
// holds more than a rank's own rows (the all-gather path rotates the whole sequence it builds anyway).
Tensor rotate_local(BlockContext& ctx, const Dims& d, const Tensor& rows, std::int64_t D, float theta, bool inverse) {
  Backend& b = ctx.b;
  const int rank = ctx.options.context.rank;
  Tensor out = b.empty(Shape{d.local_rows() * d.S, D}, ctx.act);
  if (theta <= 0) {
    b.copy(rows, out);
    return out;
  }
  Tensor chunks = b.empty(Shape{d.local_rows() * d.S, D}, ctx.act);
  b.gather_rows(rows, local_from_chunks(ctx, d, true, d.S), chunks);
  for (int w = 0; w < 2; ++w) {
    Tensor part = chunks.rows(w * d.B * d.c * d.S, d.B * d.c * d.S).view(Shape{d.B, d.c, d.S, D});
    b.rope(part, static_cast<int>(d.S), static_cast<int>(d.H + d.G), theta, inverse, chunk_of(d, rank, w) * d.c);
  }
  b.gather_rows(chunks, local_from_chunks(ctx, d, false, d.S), out);
  return out;
}


// One block of attention: this rank's local chunk w of queries against
// chunk kw of rank r's keys. Under causal attention an earlier key chunk is
// read whole, the same chunk causally, a later one not at all.
struct ChunkPair {
  int w, r, kw;
  bool diagonal;
  bool same;  // the query chunk itself: where a row's attention sink joins its softmax, once
};
std::vector<ChunkPair> pairs_with(const Dims& d, int rank, int r, bool causal) {
  std::vector<ChunkPair> out;
  for (int w = 0; w < 2; ++w)
    for (int kw = 0; kw < 2; ++kw) {
      const std::int64_t qc = chunk_of(d, rank, w), kc = chunk_of(d, r, kw);
      if (!causal || kc <= qc) out.push_back({w, r, kw, causal && kc == qc, kc == qc});
    }
  return out;
}

// (B·c·S): a pair's qkv rows (B, c, S, D) from the exchanged buffer: the
// query slots of local chunk w, the K and V slots of rank r's chunk kw.
const Tensor& pair_from_exchanged(BlockContext& ctx, const Dims& d, const ChunkPair& p) {
  return ctx.constant_ids(key(fmt::format("pair{}{}{}", p.w, p.r, p.kw).c_str(), d, 0), [&] {
    std::vector<std::int32_t> idx;
    const std::int64_t kv_base = d.local_rows() * d.S + p.r * d.kv_rows();
    for (std::int64_t b = 0; b < d.B; ++b)
      for (std::int64_t i = 0; i < d.c; ++i)
        for (std::int64_t k = 0; k < d.S; ++k)
          idx.push_back(static_cast<std::int32_t>(
              k < d.H ? (b * d.L + p.w * d.c + i) * d.S + k : kv_base + (b * d.L + p.kw * d.c + i) * 2 * d.G + (k - d.H)));
    return idx;
  });
}

// A pair's gradient (B·c·S rows) scattered back: `queries` (N_l·S) the
// query slots of local chunk w, else (N_l·2G, one block) the K and V slots
// of chunk kw; zero rows elsewhere.
const Tensor& pair_grads(BlockContext& ctx, const Dims& d, const ChunkPair& p, bool queries) {
  return ctx.constant_ids(key(fmt::format("dpair{}{}{}", queries ? 'q' : 'k', queries ? p.w : p.kw, 0).c_str(), d, 0),
                          [&] {
                            const int chunk = queries ? p.w : p.kw;
                            const std::int64_t width = queries ? d.S : 2 * d.G;
                            std::vector<std::int32_t> idx(static_cast<std::size_t>(d.local_rows() * width), -1);
                            for (std::int64_t b = 0; b < d.B; ++b)
                              for (std::int64_t i = 0; i < d.c; ++i) {
                                const std::int64_t n = b * d.L + chunk * d.c + i, row = (b * d.c + i) * d.S;
                                if (queries)
                                  for (std::int64_t k = 0; k < d.H; ++k)
                                    idx[static_cast<std::size_t>(n * d.S + k)] = static_cast<std::int32_t>(row + k);
                                else
                                  for (std::int64_t j = 0; j < 2 * d.G; ++j)
                                    idx[static_cast<std::size_t>(n * 2 * d.G + j)] =
                                        static_cast<std::int32_t>(row + d.H + j);
                              }
                            return idx;
                          });
}

AttentionOp pair_op(const AttentionOp& base, const ChunkPair& p) {
  AttentionOp op = base;
  op.causal = p.diagonal;
  // The merge through the log-sum-exps counts a sink in one part of a row: that part's
  // backward then gives its whole gradient (from the merged output and lse).
  if (!p.same) op.sinks = op.dsinks = Tensor();
  return op;
}

struct Ring {
  int N, next, prev;
};
Ring ring(const ContextParallel& cp) {
  return {cp.size, cp.group.ranks[static_cast<std::size_t>((cp.rank + 1) % cp.size)],
          cp.group.ranks[static_cast<std::size_t>((cp.rank + cp.size - 1) % cp.size)]};
}

// Attention of the local queries against rank r's block, merged into saved.out/lse.
void attend_block(BlockContext& ctx, const Dims& d, const AttentionOp& op, int r, ContextAttentionSaved& saved,
                  std::vector<bool>& started) {
  Backend& b = ctx.b;
  const std::int64_t D = op.head_dim, rows = d.B * d.c;
  for (const ChunkPair& p : pairs_with(d, ctx.options.context.rank, r, op.causal)) {
    Tensor qkv = b.empty(Shape{d.B, d.c, d.S, D}, ctx.act);
    b.gather_rows(saved.exchanged, pair_from_exchanged(ctx, d, p), qkv);
    Tensor out = saved.out.rows(p.w * rows, rows).view(Shape{d.B, d.c, d.H, D});
    Tensor lse = saved.lse.slice(p.w * d.B * d.H * d.c, d.B * d.H * d.c, Shape{d.B, d.H, d.c});
    if (!started[static_cast<std::size_t>(p.w)]) {
      b.attention_forward(qkv, out, lse, pair_op(op, p));
      started[static_cast<std::size_t>(p.w)] = true;
      continue;
    }
    Tensor part = b.empty(Shape{d.B, d.c, d.H, D}, ctx.act), part_lse = b.empty(Shape{d.B, d.H, d.c});
    b.attention_forward(qkv, part, part_lse, pair_op(op, p));
    b.attention_merge(out, lse, part, part_lse);
  }
}

// Ring attention forward: step s attends to block rank - s while block
// rank - s - 1 travels from the previous rank on the context stream.
void ring_forward(BlockContext& ctx, const Dims& d, const AttentionOp& op, ContextAttentionSaved& saved) {
  Backend& b = ctx.b;
  const ContextParallel& cp = ctx.options.context;
  const Ring g = ring(cp);
  const std::int64_t n = d.kv_rows(), local = d.local_rows() * d.S;
  const Stream compute = b.current_stream(), comm = ctx.context_stream();
  b.wait(comm, b.record(compute));  // this rank's block is written
  std::vector<bool> started(2, false);
  for (int s = 0; s < g.N; ++s) {
    const int block = (cp.rank - s + g.N) % g.N, incoming = (block - 1 + g.N) % g.N;
    Event arrived;
    if (s < g.N - 1) {
      StreamScope on_comm(b, comm);
      Tensor in = saved.exchanged.rows(local + incoming * n, n);
      b.send_recv(saved.exchanged.rows(local + block * n, n), g.next, in, g.prev, kContextRingTag + s);
      arrived = b.record(comm);
    }
    attend_block(ctx, d, op, block, saved, started);
    if (s < g.N - 1) b.wait(compute, arrived);
  }
}

// This rank's share of the gradients of rank r's block: the K and V
// gradients of the block (N_l·2G rows), and the query gradients added into `dq`.
Tensor block_grads(BlockContext& ctx, const Dims& d, const AttentionOp& op, int r, const ContextAttentionSaved& saved,
                   const Tensor& dchunks, Tensor& dq) {
  Backend& b = ctx.b;
  const std::int64_t D = op.head_dim, rows = d.B * d.c;
  Tensor dkv = b.empty(Shape{d.kv_rows(), D}, ctx.act);
  b.fill(dkv, 0.f);
  for (const ChunkPair& p : pairs_with(d, ctx.options.context.rank, r, op.causal)) {
    Tensor qkv = b.empty(Shape{d.B, d.c, d.S, D}, ctx.act), dqkv = b.empty(Shape{d.B, d.c, d.S, D}, ctx.act);
    b.gather_rows(saved.exchanged, pair_from_exchanged(ctx, d, p), qkv);
    // The merged output and log-sum-exp: each pair's share of the exact gradient.
    const Tensor dout = dchunks.rows(p.w * rows, rows).view(Shape{d.B, d.c, d.H, D});
    const Tensor out = saved.out.rows(p.w * rows, rows).view(Shape{d.B, d.c, d.H, D});
    const Tensor lse = saved.lse.slice(p.w * d.B * d.H * d.c, d.B * d.H * d.c, Shape{d.B, d.H, d.c});
    b.attention_backward(dout, qkv, out, lse, dqkv, pair_op(op, p));
    Tensor part_q = b.empty(Shape{d.local_rows() * d.S, D}, ctx.act), part_kv = b.empty(Shape{d.kv_rows(), D}, ctx.act);
    b.gather_rows(dqkv.view(Shape{rows * d.S, D}), pair_grads(ctx, d, p, true), part_q);
    b.add(dq, part_q, dq);
    b.gather_rows(dqkv.view(Shape{rows * d.S, D}), pair_grads(ctx, d, p, false), part_kv);
    b.add(dkv, part_kv, dkv);
  }
  return dkv;
}

// Ring attention backward: the K and V gradients of block rank - s - 2 are
// computed while the running sum of block rank - s - 1 travels on; after
// N - 1 steps this rank holds its own block's sum over every rank's queries.
Tensor ring_backward(BlockContext& ctx, const Dims& d, const AttentionOp& op, const ContextAttentionSaved& saved,
                     const Tensor& dchunks, Tensor& dq) {
  Backend& b = ctx.b;
  const ContextParallel& cp = ctx.options.context;
  const Ring g = ring(cp);
  const Stream compute = b.current_stream(), comm = ctx.context_stream();
  Tensor partial = block_grads(ctx, d, op, (cp.rank - 1 + g.N) % g.N, saved, dchunks, dq);
  for (int s = 0; s < g.N - 1; ++s) {
    Tensor incoming = b.empty(Shape{d.kv_rows(), op.head_dim}, ctx.act);
    b.wait(comm, b.record(compute));  // `partial` is summed
    Event arrived;
    {
      StreamScope on_comm(b, comm);
      b.send_recv(partial, g.next, incoming, g.prev, kContextRingTag + g.N + s);
      arrived = b.record(comm);
    }
    const Tensor mine = block_grads(ctx, d, op, (cp.rank - s - 2 + 2 * g.N) % g.N, saved, dchunks, dq);
    b.wait(compute, arrived);
    partial = b.empty(Shape{d.kv_rows(), op.head_dim}, ctx.act);
    b.add(incoming, mine, partial);
  }
  return partial;
}

// (N_l·S): the local dqkv rows from [query gradients (N_l·S) | own K, V gradients (N_l·2G)].
const Tensor& local_from_ring_grads(BlockContext& ctx, const Dims& d) {
  return ctx.constant_ids(key("ring_grads", d, 0), [&] {
    std::vector<std::int32_t> idx;
    const std::int64_t kv_base = d.local_rows() * d.S;
    for (std::int64_t n = 0; n < d.local_rows(); ++n)
      for (std::int64_t k = 0; k < d.S; ++k)
        idx.push_back(static_cast<std::int32_t>(k < d.H ? n * d.S + k : kv_base + n * 2 * d.G + (k - d.H)));
    return idx;
  });
}
}  // namespace

Tensor context_attention_forward(BlockContext& ctx, int batch, std::int64_t local_seq, const Tensor& qkv,
                                 const AttentionOp& op, float rope_theta, ContextAttentionSaved& saved) {
  Backend& b = ctx.b;
  const ContextParallel& cp = ctx.options.context;
  const Dims d = dims(ctx, batch, local_seq, op);
  const std::int64_t D = op.head_dim, local = d.local_rows() * d.S;
  const bool ring = cp.comm == ContextComm::ring;
  // [local qkv rows | every rank's K, V rows]: what backward rebuilds the attention from. The ring
  // rotates the local rows before they travel (its blocks are attended to apart from the sequence).
  saved.exchanged = b.empty(Shape{local + d.N * d.kv_rows(), D}, ctx.act);
  Tensor own = saved.exchanged.rows(0, local);
  const Tensor rows = qkv.view(Shape{local, D});
  b.copy(ring ? rotate_local(ctx, d, rows, D, rope_theta, false) : rows, own);
  Tensor all = saved.exchanged.rows(local, d.N * d.kv_rows());
  saved.out = b.empty(Shape{2 * d.B * d.c, d.H * D}, ctx.act);
  saved.lse = b.empty(Shape{2, d.B, d.H, d.c});
  if (ring) {
    Tensor mine = all.rows(cp.rank * d.kv_rows(), d.kv_rows());
    b.gather_rows(own, kv_of_local(ctx, d, cp.rank), mine);
    ring_forward(ctx, d, op, saved);
  } else {
    Tensor kv = b.empty(Shape{d.kv_rows(), D}, ctx.act);
    b.gather_rows(own, kv_of_local(ctx, d, cp.rank), kv);
    b.all_gather(kv, all, cp.group);
    const Tensor full = whole_sequence(ctx, d, saved.exchanged, op, rope_theta);
    for (int w = 0; w < 2; ++w) {
      Tensor out = saved.out.rows(w * d.B * d.c, d.B * d.c).view(Shape{d.B, d.c, d.H, D});
      Tensor lse = saved.lse.slice(w * d.B * d.H * d.c, d.B * d.H * d.c, Shape{d.B, d.H, d.c});
      b.attention_forward(full, out, lse, chunk_op(op, d, cp.rank, w));
    }
  }
  Tensor attn = b.empty(Shape{d.local_rows(), d.H * D}, ctx.act);
  b.gather_rows(saved.out, local_from_chunks(ctx, d, false), attn);
  return attn;
}

Tensor context_attention_backward(BlockContext& ctx, int batch, std::int64_t local_seq, const Tensor& dattn,
                                  const AttentionOp& op, float rope_theta, const ContextAttentionSaved& saved) {
  Backend& b = ctx.b;
  const ContextParallel& cp = ctx.options.context;
  const int rank = cp.rank;
  const Dims d = dims(ctx, batch, local_seq, op);
  const std::int64_t D = op.head_dim, whole = d.B * d.T * d.S;
  Tensor dchunks = b.empty(Shape{2 * d.B * d.c, d.H * D}, ctx.act);
  b.gather_rows(dattn.view(Shape{d.local_rows(), d.H * D}), local_from_chunks(ctx, d, true), dchunks);
  if (cp.comm == ContextComm::ring) {
    // [query gradients of the local rows | this rank's K, V gradients summed over the ring].
    Tensor grads = b.empty(Shape{d.local_rows() * d.S + d.kv_rows(), D}, ctx.act);
    Tensor dq = grads.rows(0, d.local_rows() * d.S);
    b.fill(dq, 0.f);
    const Tensor dkv = ring_backward(ctx, d, op, saved, dchunks, dq);
    Tensor mine = grads.rows(d.local_rows() * d.S, d.kv_rows());
    b.copy(dkv, mine);
    Tensor rotated = b.empty(Shape{d.local_rows() * d.S, D}, ctx.act);
    b.gather_rows(grads, local_from_ring_grads(ctx, d), rotated);
    return rotate_local(ctx, d, rotated, D, rope_theta, true).view(Shape{d.local_rows(), d.S * D});
  }
  const Tensor full = whole_sequence(ctx, d, saved.exchanged, op, rope_theta);
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
  if (rope_theta > 0) b.rope(dfull, static_cast<int>(d.S), static_cast<int>(d.H + d.G), rope_theta, true, 0);
  Tensor by_owner = b.empty(Shape{d.N * d.kv_rows(), D}, ctx.act);
  b.gather_rows(grads.rows(0, whole), kv_grads_by_owner(ctx, d, rank), by_owner);
  Tensor mine = grads.rows(whole, d.kv_rows());
  b.reduce_scatter(by_owner, mine, cp.group, ReduceOp::sum);
  Tensor dqkv = b.empty(Shape{d.local_rows() * d.S, D}, ctx.act);
  b.gather_rows(grads, local_grads(ctx, d, rank), dqkv);
  return dqkv.view(Shape{d.local_rows(), d.S * D});
}

}  // namespace meshtrain
