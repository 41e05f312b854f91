// The table's training ops (backends/op_table.h): the vocab-parallel loss,
// the optimizer, 1-bit gradient compression and communication, in
// backend.h's order.
#include <numeric>

#include "backends/op_entries.h"

namespace meshtrain::op_entries {
namespace {

using Sample = Result<OpSample>;
using SS = SampleShape;

// The loss over N = rows tokens of a V = cols vocabulary: logits at the
// shape's dtype, targets i32 and the row statistics f32.
struct Loss {
  Tensor logits, targets, row_max, sumexp, target_logit, losses;
};
Loss loss(Backend& b, const SS& s) {
  return {filled(b, Shape{s.rows, s.cols}, 0.5f, s.dtype),
          ids(b, s.rows, s.cols),
          filled(b, Shape{s.rows}, 0.f),
          filled(b, Shape{s.rows}, 1.f),
          filled(b, Shape{s.rows}, 0.f),
          filled(b, Shape{s.rows}, 0.f)};
}

void append_loss(std::vector<OpInfo>& t) {
  t.push_back({.name = "cross_entropy_max",
               .cost_name = "cross_entropy_max",
               .cls = CostClass::memory,
               .operands = "logits (N, V) -> row_max (N) f32",
               .traffic = {1, 1},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Loss l = loss(b, s);
                 return sampled("cross_entropy_max", [=, &b]() mutable { b.cross_entropy_max(l.logits, l.row_max); },
                                {&l.logits, &l.row_max});
               }});
  t.push_back({.name = "cross_entropy_partials",
               .cost_name = "cross_entropy_partials",
               .cls = CostClass::memory,
               .operands = "logits (N, V), targets (N) i32, row_max (N) -> sumexp, target_logit (N) f32",
               .traffic = {1, 1, 1, 1, 1},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Loss l = loss(b, s);
                 return sampled("cross_entropy_partials",
                                [=, &b]() mutable {
                                  b.cross_entropy_partials(l.logits, l.targets, l.row_max, 0, l.sumexp, l.target_logit);
                                },
                                {&l.logits, &l.targets, &l.row_max, &l.sumexp, &l.target_logit});
               }});
  t.push_back({.name = "cross_entropy_loss",
               .cost_name = "cross_entropy_loss",
               .cls = CostClass::memory,
               .operands = "row_max, sumexp, target_logit (N) f32 -> losses (N) f32",
               .traffic = {1, 1, 1, 1},
               .grid = Grid::rows,
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Loss l = loss(b, {s.rows, 1, s.dtype});
                 return sampled(
                     "cross_entropy_loss",
                     [=, &b]() mutable { b.cross_entropy_loss(l.row_max, l.sumexp, l.target_logit, l.losses); },
                     {&l.row_max, &l.sumexp, &l.target_logit, &l.losses});
               }});
  t.push_back({.name = "cross_entropy_backward",
               .cost_name = "cross_entropy_backward",
               .cls = CostClass::memory,
               .operands = "logits (N, V), targets (N) i32, row_max, sumexp (N) f32 -> dlogits (N, V)",
               .traffic = {1, 1, 1, 1, 1},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Loss l = loss(b, s);
                 Tensor dl = filled(b, l.logits.shape(), 0.f, s.dtype);
                 return sampled("cross_entropy_backward",
                                [=, &b]() mutable {
                                  b.cross_entropy_backward(l.logits, l.targets, l.row_max, l.sumexp, 0, 1e-3f, dl);
                                },
                                {&l.logits, &l.targets, &l.row_max, &l.sumexp, &dl});
               }});
  t.push_back({.name = "cross_entropy_accuracy",
               .cost_name = "cross_entropy_accuracy",
               .cls = CostClass::memory,
               .operands = "row_max, target_logit (N) f32 -> correct (1) f32",
               .traffic = {1, 1, 1},
               .grid = Grid::rows,
               .sample = [](Backend& b, const SS& s) -> Sample {
                 Loss l = loss(b, {s.rows, 1, s.dtype});
                 Tensor correct = filled(b, Shape{1}, 0.f);
                 return sampled(
                     "cross_entropy_accuracy",
                     [=, &b]() mutable { b.cross_entropy_accuracy(l.row_max, l.target_logit, correct, false); },
                     {&l.row_max, &l.target_logit, &correct});
               }});
}

// fp32 param, grad, m and v of rows × cols, in host memory when `host`.
AdamWTensors adamw_tensors(Backend& b, const SS& s, bool host) {
  const Shape shape{s.rows, s.cols};
  if (host) return {b.host_zeros(shape), b.host_zeros(shape), b.host_zeros(shape), b.host_zeros(shape), 0.f};
  return {filled(b, shape, 0.f), filled(b, shape, 0.25f), filled(b, shape, 0.f), filled(b, shape, 0.f), 0.f};
}
// The step's update: one multi-tensor AdamW with a clip coefficient, as the step passes one when it clips.
Sample foreach_adamw_sample(Backend& b, const SS& s, bool host) {
  const AdamWTensors p = adamw_tensors(b, s, host);
  Tensor coef = filled(b, Shape{1}, 1.f);
  AdamWOp a;
  a.lr = 1e-6f;
  const std::vector<AdamWTensors> group = {p};
  return sampled(host ? "host_adamw" : "foreach_adamw", [=, &b]() mutable { b.foreach_adamw(group, coef, a); },
                 {&coef, &p.param, &p.grad, &p.m, &p.v});
}

void append_optimizer(std::vector<OpInfo>& t) {
  t.push_back({.name = "clip_coefficient",
               .cost_name = "clip_coefficient",
               .cls = CostClass::memory,
               .operands = "sumsq (1) -> coef (1) f32",
               .traffic = {1, 1},
               .grid = Grid::scalar,
               .sample = [](Backend& b, const SS&) -> Sample {
                 Tensor sumsq = filled(b, Shape{1}, 4.f), coef = filled(b, Shape{1}, 0.f);
                 return sampled("clip_coefficient", [=, &b]() mutable { b.clip_coefficient(sumsq, 1.f, coef); },
                                {&sumsq, &coef});
               }});
  // Reads param, grad, m, v and the coefficient; writes param, m, v.
  t.push_back({.name = "adamw",
               .cost_name = "adamw",
               .cls = CostClass::memory,
               .operands = "param, grad, m, v (n) f32 (param, m, v in place), coef (1) optional",
               .traffic = {2, 1, 2, 2, 1},
               .sample = [](Backend& b, const SS& s) -> Sample {
                 const AdamWTensors p = adamw_tensors(b, s, false);
                 Tensor coef = filled(b, Shape{1}, 1.f);
                 AdamWOp a;
                 a.lr = 1e-6f;
                 return sampled("adamw",
                                [=, &b]() mutable {
                                  Tensor param = p.param, m = p.m, v = p.v;
                                  b.adamw(param, p.grad, m, v, coef, a);
                                },
                                {&p.param, &p.grad, &p.m, &p.v, &coef});
               }});
  t.push_back(
      {.name = "foreach_sum_squares",
       .cost_name = "sum_squares",
       .cls = CostClass::memory,
       .operands = "out (1) f32 +=, then xs[i] (any shape) of one float dtype",
       .traffic = {1, 1},
       .repeat = 1,
       .sample = [](Backend& b, const SS& s) -> Sample {
         Tensor one = filled(b, Shape{1}, 0.f);
         const std::vector<Tensor> xs = {filled(b, Shape{s.rows, s.cols}, 0.5f, s.dtype)};
         return sampled("foreach_sum_squares", [=, &b]() mutable { b.foreach_sum_squares(xs, one); }, {&one, &xs[0]});
       }});
  t.push_back({.name = "foreach_adamw",
               .cost_name = "adamw",
               .cls = CostClass::memory,
               .operands = "coef (1) optional, then per parameter: param, grad, m, v (n) f32",
               .traffic = {1, 2, 1, 2, 2},
               .repeat = 4,
               .sample = [](Backend& b, const SS& s) { return foreach_adamw_sample(b, s, false); }});
  // The offloaded update (Plan::offload): foreach_adamw with every tensor in host memory, on the host's cores.
  t.push_back({.name = "host_adamw",
               .cost_name = "host_adamw",
               .cls = CostClass::host,
               .operands = "foreach_adamw's, every tensor but coef in host memory",
               .traffic = {1, 2, 1, 2, 2},
               .repeat = 4,
               .host_memory = true,
               .sample = [](Backend& b, const SS& s) { return foreach_adamw_sample(b, s, true); },
               .method = "foreach_adamw"});
}

void append_compression(std::vector<OpInfo>& t) {
  // Rows are chunks of `cols` fp32 gradients, compressed with error feedback (1-bit gradients).
  t.push_back(
      {.name = "sign_compress",
       .cost_name = "sign_compress",
       .cls = CostClass::memory,
       .operands = "x (C, k) f32, error (C, k) f32 in place, optional -> packets (C, 1 + ceil(k/32)) i32",
       .traffic = {1, 2, 1},
       .sample = [](Backend& b, const SS& s) -> Sample {
         Tensor x = filled(b, Shape{s.rows, s.cols}, 0.5f), e = filled(b, Shape{s.rows, s.cols}, 0.25f);
         Tensor packets = b.empty(Shape{s.rows, 1 + (s.cols + 31) / 32}, DType::i32);
         return sampled("sign_compress", [=, &b]() mutable { b.sign_compress(x, e, packets); }, {&x, &e, &packets});
       }});
  t.push_back(
      {.name = "sign_decompress",
       .cost_name = "sign_decompress",
       .cls = CostClass::memory,
       .operands = "packets (C, 1 + ceil(k/32)) i32 -> out (C, k) f32",
       .traffic = {1, 1},
       .shape_of = 1,
       .sample = [](Backend& b, const SS& s) -> Sample {
         Tensor x = filled(b, Shape{s.rows, s.cols}, 0.5f), e = filled(b, Shape{s.rows, s.cols}, 0.25f);
         Tensor packets = b.empty(Shape{s.rows, 1 + (s.cols + 31) / 32}, DType::i32), z = filled(b, x.shape(), 0.f);
         b.sign_compress(x, e, packets);
         return sampled("sign_decompress", [=, &b]() mutable { b.sign_decompress(packets, z); }, {&packets, &z});
       }});
}

// The partner of b's rank in a point-to-point sample: rank ^ 1, which must exist.
Result<int> pair_peer(const Backend& b, std::string_view op) {
  const int peer = b.rank() ^ 1;
  if (peer >= b.world_size())
    return make_error(
        "the {} sample needs a world of two or more ranks (rank {} has no partner {} of {}); "
        "run it on ranks r and r ^ 1 at once",
        op, b.rank(), peer, b.world_size());
  return peer;
}

// Collectives over the one-member group of the backend's rank.
void append_communication(std::vector<OpInfo>& t) {
  const auto coll = [](std::string_view name, std::string_view operands, OpInfo::CostFn cost, OpInfo::SampleFn fn) {
    return OpInfo{.name = name,
                  .cost_name = name,
                  .cls = CostClass::collective,
                  .operands = operands,
                  .cost = cost,
                  .sample = fn};
  };
  t.push_back(coll("all_reduce", "x (n) in place", operand_bytes_cost<0>, [](Backend& b, const SS& s) -> Sample {
    Tensor x = filled(b, Shape{s.rows * s.cols}, 1.f);
    return sampled("all_reduce", [=, &b]() mutable { b.all_reduce(x, self_group(b), ReduceOp::sum); }, {&x});
  }));
  t.push_back(coll(
      "reduce_scatter", "in (members · n) -> out (n)", operand_bytes_cost<0>, [](Backend& b, const SS& s) -> Sample {
        Tensor in = filled(b, Shape{s.rows * s.cols}, 1.f), out = filled(b, Shape{s.rows * s.cols}, 0.f);
        return sampled("reduce_scatter", [=, &b]() mutable { b.reduce_scatter(in, out, self_group(b), ReduceOp::sum); },
                       {&in, &out});
      }));
  t.push_back(
      coll("all_gather", "in (n) -> out (members · n)", operand_bytes_cost<1>, [](Backend& b, const SS& s) -> Sample {
        Tensor in = filled(b, Shape{s.rows * s.cols}, 1.f), out = filled(b, Shape{s.rows * s.cols}, 0.f);
        return sampled("all_gather", [=, &b]() mutable { b.all_gather(in, out, self_group(b)); }, {&in, &out});
      }));
  t.push_back(coll("broadcast", "x (n) in place", operand_bytes_cost<0>, [](Backend& b, const SS& s) -> Sample {
    Tensor x = filled(b, Shape{s.rows * s.cols}, 1.f);
    return sampled("broadcast", [=, &b]() mutable { b.broadcast(x, self_group(b), b.rank()); }, {&x});
  }));
  t.push_back(coll("all_to_all", "in (Σ send_counts) -> out (Σ recv_counts); OpArgs::exchanged", all_to_all_cost,
                   [](Backend& b, const SS& s) -> Sample {
                     const std::int64_t n = s.rows * s.cols;
                     Tensor in = filled(b, Shape{n}, 1.f), out = filled(b, Shape{n}, 0.f);
                     OpArgs a;
                     a.exchanged = n;
                     return sampled(
                         "all_to_all",
                         [=, &b]() mutable {
                           const std::vector<std::int64_t> counts = {n};
                           b.all_to_all(in, counts, out, counts, self_group(b));
                         },
                         {&in, &out}, a);
                   }));
  t.push_back(coll("barrier", "none", barrier_cost, [](Backend& b, const SS&) -> Sample {
    return sampled("barrier", [&b] { b.barrier(self_group(b)); }, {});
  }));
  // Point to point between ranks r and r ^ 1 (a world of two or more): one side sends, the other receives.
  const auto p2p = [](std::string_view name, std::string_view operands, OpInfo::CostFn cost, OpInfo::SampleFn fn) {
    return OpInfo{
        .name = name, .cost_name = name, .cls = CostClass::p2p, .operands = operands, .cost = cost, .sample = fn};
  };
  t.push_back(p2p("send", "x (n) to a peer", operand_bytes_cost<0>, [](Backend& b, const SS& s) -> Sample {
    MT_ASSIGN(const int peer, pair_peer(b, "send"));
    Tensor x = filled(b, Shape{s.rows * s.cols}, 1.f);
    const bool sends = b.rank() % 2 == 0;
    return sampled("send", [=, &b]() mutable { sends ? b.send(x, peer, 1) : b.recv(x, peer, 1); }, {&x});
  }));
  t.push_back(p2p("recv", "x (n) from a peer", operand_bytes_cost<0>, [](Backend& b, const SS& s) -> Sample {
    MT_ASSIGN(const int peer, pair_peer(b, "recv"));
    Tensor x = filled(b, Shape{s.rows * s.cols}, 1.f);
    const bool receives = b.rank() % 2 == 0;
    return sampled("recv", [=, &b]() mutable { receives ? b.recv(x, peer, 2) : b.send(x, peer, 2); }, {&x});
  }));
  t.push_back(
      p2p("send_recv", "out (n) to a peer, in (n) from a peer", operand_bytes_cost<0>,
          [](Backend& b, const SS& s) -> Sample {
            MT_ASSIGN(const int peer, pair_peer(b, "send_recv"));
            Tensor out = filled(b, Shape{s.rows * s.cols}, 1.f), in = filled(b, Shape{s.rows * s.cols}, 0.f);
            return sampled("send_recv", [=, &b]() mutable { b.send_recv(out, peer, in, peer, 3); }, {&out, &in});
          }));
}

}  // namespace

void append_training(std::vector<OpInfo>& table) {
  append_loss(table);
  append_optimizer(table);
  append_compression(table);
  append_communication(table);
}

}  // namespace meshtrain::op_entries
