#include "engine/parallel/pipeline_executor.h"

#include <algorithm>

#include "engine/schedule/communication.h"
#include "engine/schedule/validate.h"

namespace meshtrain {

Result<PipelineExecutor> PipelineExecutor::create(const Plan& plan, const Mesh& mesh, int rank) {
  const schedule::PipelineLayout layout{plan.pp, plan.vpp, plan.microbatches()};
  MT_ASSIGN(schedule::Schedule compute, schedule::build_schedule(plan.schedule, layout));
  std::vector<schedule::Pair> pairs;
  if (plan.moe_a2a_overlap) {
    schedule::PairedSchedule paired = schedule::pair_forward_backward(compute);
    compute = std::move(paired.compute), pairs = std::move(paired.pairs);
  }
  MT_ASSIGN(schedule::Schedule full, schedule::insert_communication(compute));
  if (plan.moe_a2a_overlap) full = schedule::hoist_pair_communication(full, pairs);
  MT_TRY(schedule::check_invariants(full));
  PipelineExecutor e(std::move(full), std::move(pairs), mesh, rank);
  e.overlap_p2p_ = plan.overlap_p2p_comm;
  return e;
}

PipelineExecutor::PipelineExecutor(schedule::Schedule s, std::vector<schedule::Pair> pairs, const Mesh& mesh,
                                   int rank)
    : schedule_(std::move(s)) {
  const Coord c = mesh.coord_of(rank);
  stage_ = c.pp;
  for (int st = 0; st < mesh.pp(); ++st) stage_ranks_.push_back(mesh.rank_of({c.tp, c.cp, c.dp, st}));
  for (const schedule::Pair& p : pairs)
    if (p.forward.stage == stage_)
      pairs_.insert({p.forward.chunk, p.forward.microbatch, p.backward.chunk, p.backward.microbatch});
}

int PipelineExecutor::peer(const schedule::Action& a) const {
  return stage_ranks_[static_cast<std::size_t>(schedule::peer_rank(schedule_.layout, a))];
}

int PipelineExecutor::tag(const schedule::Action& a, int microbatches) const {
  using K = schedule::Action;
  const int s = schedule::virtual_stage(schedule_.layout, a);
  // Activations cross boundary s (send) or s-1 (recv); gradients s-1 (send) or s (recv).
  const bool grad = a.kind == K::send_grad || a.kind == K::recv_grad;
  const int boundary = (a.kind == K::send_act || a.kind == K::recv_grad) ? s : s - 1;
  return (boundary * microbatches + a.microbatch) * 2 + (grad ? 1 : 0);
}

void PipelineExecutor::run(Backend& b, const PipelineCompute& compute, DType dtype, Part part) {
  using K = schedule::Action;
  const int m = schedule_.layout.microbatches, last = schedule_.layout.virtual_stages() - 1;
  const auto& actions = schedule_.ranks[static_cast<std::size_t>(stage_)];
  const auto split = std::find_if(actions.begin(), actions.end(), [](const K& a) {
    return a.kind == K::backward || a.kind == K::recv_grad || a.kind == K::send_grad;
  });
  const auto first = part == Part::from_backward ? split : actions.begin();
  const auto end = part == Part::before_backward ? split : actions.end();
  // Tensors between a compute action and its communication, by (chunk, micro-batch); a
  // forward half leaves its outputs sent, so the halves share nothing.
  std::map<std::pair<int, int>, Tensor> inputs, outputs, douts, dinputs;
  // Plan::overlap_p2p_comm on a backend that times values: where Megatron posts a receive, the start
  // of the compute action before the one that reads it (it posts the next forward's input as the
  // backward between them starts, and the next output gradient as the forward between starts).
  const bool ahead = overlap_p2p_ && !b.holds_values();
  std::optional<Event> posted;
  auto computing = [&] {
    if (ahead) posted = b.record(b.current_stream());
  };
  for (auto it = first; it != end; ++it) {
    const K& a = *it;
    const std::pair<int, int> key{a.chunk, a.microbatch};
    const int s = schedule::virtual_stage(schedule_.layout, a);
    // The tensor waiting in `from` under this action's key, taken out; undefined where none waits
    // (the first stage's input, the last stage's output gradient).
    auto take = [&key](std::map<std::pair<int, int>, Tensor>& from) {
      Tensor t;
      if (auto found = from.find(key); found != from.end()) t = found->second, from.erase(found);
      return t;
    };
    auto receive = [&](bool grad) {
      Tensor x = b.empty(compute.boundary(a.chunk, a.microbatch, grad), dtype);
      if (!ahead) {
        b.recv(x, peer(a), tag(a, m));
        return x;
      }
      std::optional<Stream>& side = recv_[grad ? 1 : 0];
      if (!side) side = b.create_stream(grad ? "pipeline recv gradients" : "pipeline recv activations");
      const Stream here = b.current_stream();
      if (posted) b.wait(*side, *posted);
      {
        StreamScope on_side(b, *side);
        b.recv(x, peer(a), tag(a, m));
      }
      b.wait(here, b.record(*side));
      return x;
    };
    switch (a.kind) {
      case K::recv_act: inputs[key] = receive(false); break;
      case K::forward: {
        computing();
        // A pair of the EP all-to-all overlap's schedule: the forward, then at once its backward.
        const auto next = std::next(it);
        const bool paired = compute.forward_backward && next != end && next->kind == K::backward &&
                            pairs_.count({a.chunk, a.microbatch, next->chunk, next->microbatch}) > 0;
        if (paired) {
          const std::pair<int, int> back{next->chunk, next->microbatch};
          const int sb = schedule::virtual_stage(schedule_.layout, *next);
          Tensor dout;
          if (auto found = douts.find(back); found != douts.end()) dout = found->second, douts.erase(found);
          auto [out, din] = compute.forward_backward(a.chunk, a.microbatch, take(inputs), next->chunk,
                                                     next->microbatch, dout);
          if (s < last) outputs[key] = out;
          if (sb > 0) dinputs[back] = din;
          ++it;
          break;
        }
        if (Tensor out = compute.forward(a.chunk, a.microbatch, take(inputs)); s < last) outputs[key] = out;
        break;
      }
      case K::send_act: b.send(take(outputs), peer(a), tag(a, m)); break;
      case K::recv_grad: douts[key] = receive(true); break;
      case K::backward:
        computing();
        if (Tensor din = compute.backward(a.chunk, a.microbatch, take(douts)); s > 0) dinputs[key] = din;
        break;
      case K::send_grad: b.send(take(dinputs), peer(a), tag(a, m)); break;
      case K::weight:
        computing();
        compute.weight(a.chunk, a.microbatch);
        break;
    }
  }
}

void PipelineExecutor::run_forward(Backend& b, int microbatches, const PipelineCompute& compute, DType dtype) {
  const schedule::PipelineLayout& layout = schedule_.layout;
  const int last = layout.virtual_stages() - 1;
  for (int j = 0; j < microbatches; ++j)
    for (int c = 0; c < layout.chunks_per_stage; ++c) {
      const schedule::Action f{schedule::Action::forward, stage_, c, j};
      const int s = schedule::virtual_stage(layout, f);
      Tensor in;
      if (s > 0) {
        const schedule::Action r{schedule::Action::recv_act, stage_, c, j};
        in = b.empty(compute.boundary(c, j, false), dtype);
        b.recv(in, peer(r), tag(r, microbatches));
      }
      Tensor out = compute.forward(c, j, in);
      if (s < last) {
        const schedule::Action snd{schedule::Action::send_act, stage_, c, j};
        b.send(out, peer(snd), tag(snd, microbatches));
      }
    }
}

}  // namespace meshtrain
