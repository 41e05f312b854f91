// The measured per-rank peak of live tensor bytes during a step (cpu backend,
// reset at the start of the step) agrees with the analytic memory model
// (engine/memory/memory_model.h, meshtrain's activation layout) within 10%.
#include <catch2/catch.hpp>

#include "backends/cpu/comm/in_process.h"
#include "engine/memory/memory_model.h"
#include "engine/plan/segment_plan.h"
#include "tests/parallel/parallel_harness.h"
#include "tests/segmented_plan.h"

using namespace meshtrain;
using namespace meshtrain::testing;

namespace {

// The global batch of step 1 at the plan's sequence length (the harness's kSeq unless the plan says otherwise).
std::vector<HostBatch> step_batch(const ModelSpec& m, const Plan& p) {
  std::vector<HostBatch> all = global_batch(m, 1);
  if (p.seq_len == kSeq || m.vision()) return all;
  for (HostBatch& h : all) {
    h.seq = p.seq_len;
    h.ids.resize(static_cast<std::size_t>(h.batch) * h.seq);
    h.targets.resize(h.ids.size());
    for (std::size_t i = 0; i < h.ids.size(); ++i)
      h.ids[i] = static_cast<std::int32_t>(i * 7 % 256), h.targets[i] = static_cast<std::int32_t>((i * 7 + 1) % 256);
  }
  return all;
}

// `stage` >= 0: check that pipeline stage's ranks only (of a uniform plan).
void check_memory(const Plan& p, const ModelSpec& m = tiny_gpt(), int only_stage = -1) {
  const Mesh mesh(p);
  std::vector<MemoryStats> peaks(static_cast<std::size_t>(p.world_size()));
  const Status s = run_ranks(p.world_size(), [&](int rank, Communicator& comm) -> Status {
    CpuBackend b(comm);
    TrainingEngine engine(b, m, p, step_options());
    // This rank's share: its replica's micro-batches, or the whole batch for a plan made of segments.
    const DataShare share = engine.data_share();
    const std::vector<HostBatch> all = recut(step_batch(m, p), share.micro_batch);
    const std::vector<HostBatch> mine(all.begin() + share.replica * share.count,
                                      all.begin() + (share.replica + 1) * share.count);
    b.reset_peak();
    MT_ASSIGN(StepResult r, engine.step(mine, 1e-2f, 1));
    (void)r;
    peaks[static_cast<std::size_t>(rank)] = b.memory_stats();
    return ok_status();
  });
  REQUIRE(s.ok());
  for (int rank = 0; rank < p.world_size(); ++rank) {
    const int stage = p.segments.empty() ? mesh.coord_of(rank).pp : -1;
    if (only_stage >= 0 && stage != only_stage) continue;
    const MemoryBreakdown model = rank_memory(m, p, rank);
    const double measured = static_cast<double>(peaks[static_cast<std::size_t>(rank)].peak_bytes);
    INFO("plan tp " << p.tp << (p.sequence_parallel ? " sp" : "") << " zero " << p.zero << " " << schedule_name(p.schedule) << " pp" << p.pp << " dp" << p.dp
                      << " cp" << p.cp << " stage layers " << p.first_stage_layers << "/" << p.last_stage_layers
                      << " segments " << p.segments.size() << ", rank "
                      << rank << " (stage " << stage << "): measured " << measured << " B, model " << model.total()
                      << " B (parameters " << model.parameters << ", gradients " << model.gradients
                      << ", optimizer " << model.optimizer << ", zero-3 working " << model.zero3_working
                      << ", gradient working " << model.gradient_working << ", gradient shard " << model.gradient_shard
                      << ", activations " << model.activations << ", backward working " << model.backward_working
                      << ")");
    CHECK(measured == Approx(model.total()).epsilon(0.10));
  }
}

}  // namespace

TEST_CASE("measured peak memory matches the memory model per ZeRO stage and schedule", "[parallel][memory]") {
  for (int zero : {0, 1, 2, 3}) check_memory(make_plan(1, 2, 2, zero, ScheduleKind::one_f_one_b));
  for (int zero : {1, 2, 3}) {
    check_memory(make_plan(1, 2, 2, zero, ScheduleKind::gpipe));
    check_memory(make_plan(1, 2, 2, zero, ScheduleKind::interleaved, 2));
  }
  // Sharded states dominate more with more replicas: ZeRO-2/3 must really free what they shard.
  for (int zero : {2, 3}) check_memory(make_plan(1, 1, 4, zero, ScheduleKind::one_f_one_b));
}

TEST_CASE("measured peak memory matches the memory model under sequence parallelism", "[parallel][memory][sp]") {
  for (int zero : {1, 3}) {
    Plan p = make_plan(2, 2, 2, zero, ScheduleKind::one_f_one_b);
    p.sequence_parallel = true;
    check_memory(p);
  }
}

TEST_CASE("measured peak memory matches the memory model with uneven pipeline stages", "[parallel][memory][uneven]") {
  // 6 layers as 2 + 4: the stages differ in parameters and in activations per in-flight micro-batch.
  for (int zero : {1, 3}) check_memory(with_stage_layers(make_plan(1, 2, 2, zero, ScheduleKind::one_f_one_b), 2, 4), tiny_gpt6());
  check_memory(with_stage_layers(make_plan(1, 2, 2, 1, ScheduleKind::interleaved, 2), 2, 4), tiny_gpt6());
  // 1 + 4 + 1: the middle stage holds the most layers but neither embedding nor head.
  check_memory(with_stage_layers(make_plan(1, 3, 1, 0, ScheduleKind::one_f_one_b), 1, 1), tiny_gpt6());
}

TEST_CASE("measured peak memory matches the memory model for the VQA model", "[parallel][memory][vqa]") {
  // vqa-tiny four times as wide: at width 32 the step's uploaded images (which
  // the model does not count; 25 KB a micro-batch) rival the activations.
  ModelSpec vqa = *model_preset("vqa-tiny");
  vqa.name = "vqa-wide";
  vqa.vision_encoder.hidden = vqa.hidden = 128;
  vqa.vision_encoder.ffn = vqa.ffn = 256;
  // Stage 0 the encoder's first layer, or everything up to the decoder's first layer.
  for (int first : {1, 5})
    for (int zero : {1, 3})
      check_memory(with_stage_layers(make_plan(1, 2, 2, zero, ScheduleKind::one_f_one_b), first, 0), vqa);
  Plan sp = make_plan(2, 1, 2, 1, ScheduleKind::gpipe);
  sp.sequence_parallel = true;
  check_memory(sp, vqa);
}

TEST_CASE("measured peak memory matches the memory model under context parallelism", "[parallel][memory][cp]") {
  // The whole sequence's K and V kept per layer, ZeRO over the dp·cp ranks.
  for (int zero : {0, 1, 3}) {
    Plan p = make_plan(1, 2, 1, zero, ScheduleKind::one_f_one_b);
    p.cp = 2;
    check_memory(p);
  }
  // Long sequences, where the activations (and the gathered K and V) outweigh the tiny model's states;
  // on the last stage the head's logits and a layer's backward working set are not live at once.
  for (int cp : {2, 4}) {
    Plan p = make_plan(1, 2, 1, 1, ScheduleKind::one_f_one_b);
    p.cp = cp, p.seq_len = 1024;
    check_memory(p, tiny_llama());
  }
  Plan p = make_plan(2, 2, 1, 2, ScheduleKind::one_f_one_b);
  p.cp = 2, p.seq_len = 512;
  check_memory(p, tiny_llama());
}

TEST_CASE("measured peak memory matches the memory model under ring context parallelism", "[parallel][memory][cp][ring]") {
  // The ring keeps every block it received for backward, as the all-gather does, but works on one
  // block pair at a time and rotates its own rows only: no whole-sequence working buffers.
  for (int cp : {2, 4}) {
    Plan p = make_plan(1, 2, 1, 1, ScheduleKind::one_f_one_b);
    p.cp = cp, p.seq_len = 1024, p.cp_comm = ContextComm::ring;
    check_memory(p, tiny_llama());
  }
  Plan p = make_plan(2, 2, 1, 2, ScheduleKind::one_f_one_b);
  p.cp = 2, p.seq_len = 512, p.cp_comm = ContextComm::ring;
  check_memory(p, tiny_llama());
}

TEST_CASE("measured peak memory matches the memory model under ZB-H1", "[parallel][memory][zb]") {
  // Stage r holds r micro-batches between their B and W passes: their activations and the output
  // gradients the deferred weight gradients read. Long sequences, so activations dominate.
  ModelSpec m = tiny_llama();
  m.layers = 6;
  for (int zero : {0, 1}) {
    Plan p = make_plan(1, 3, 1, zero, ScheduleKind::zb_h1);
    p.seq_len = 512;
    check_memory(p, m);
  }
}

TEST_CASE("measured peak memory matches the memory model with flexible interleaved layouts", "[parallel][memory][flexible]") {
  Plan uneven = make_plan(1, 2, 1, 1, ScheduleKind::interleaved, 2);
  uneven.chunk_layers = {1, 2, 2, 1};
  check_memory(uneven, tiny_gpt6());
  Plan ends = make_plan(1, 2, 1, 1, ScheduleKind::interleaved, 4);
  ends.embedding_in_split = ends.loss_in_split = true;
  check_memory(ends, tiny_gpt6());
}

TEST_CASE("measured peak memory matches the memory model for plans made of segments", "[parallel][memory][segments]") {
  // Each rank holds what rank_memory sums over the segments it is in: on disjoint ranks one segment's
  // stage, on the same ranks both segments' parameters, state and activations.
  const ModelSpec m = tiny_llama();
  const Plan single = make_plan(1, 1, 1, 0, ScheduleKind::one_f_one_b);
  check_memory(segmented(m, single, R"([
      {"blocks": [0, 2], "tp": 2, "ranks": [0, 1], "zero": 1},
      {"blocks": [3, 5], "pp": 2, "dp": 2, "microbatches": 2, "ranks": [2, 5], "zero": 2}])"), m);
  check_memory(segmented(m, single, R"([
      {"blocks": [0, 2], "dp": 2, "zero": 1},
      {"blocks": [3, 5], "tp": 2}])"), m);
}
