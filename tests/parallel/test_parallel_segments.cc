// Plans made of segments (engine/plan/segment_plan.h): each segment its own tp, pp,
// dp, micro-batches, ZeRO and sequence parallelism, on the same ranks as its
// neighbour or on ranks of its own, compute what the single-rank run
// computes (the same checks and tolerances as every other plan,
// parallel_check.h), ranks as threads.
#include <catch2/catch.hpp>

#include "tests/parallel/parallel_check.h"

using namespace meshtrain;
using namespace meshtrain::testing;

namespace {

ModelSpec swin() { return *model_preset("swin-micro"); }

}  // namespace

TEST_CASE("Swin per stage: data-parallel patch embedding, tensor-parallel early stage, pipelined late stages",
          "[parallel][segments][swin]") {
  // The mission's layout on four ranks: every segment on all of them, the
  // activations resharded by all-to-all at each boundary.
  check_matches_reference(swin(), segmented(swin(), R"([
      {"modules": ["embed"], "dp": 4},
      {"modules": ["stage1"], "tp": 2, "dp": 2, "sequence_parallel": true},
      {"modules": ["stage2", "stage3", "head"], "pp": 2, "dp": 2, "microbatches": 2}])"));
  // Four pipeline stages of one replica, four micro-batches (the mission's
  // pp 4), from the middle of stage 2; ZeRO 1 in the tensor-parallel segment.
  check_matches_reference(swin(), segmented(swin(), R"([
      {"modules": ["embed"], "dp": 4},
      {"blocks": [1, 4], "tp": 4, "zero": 1},
      {"blocks": [5, 9], "pp": 4, "microbatches": 4}])"));
}

TEST_CASE("a vision-encoder-like segment on its own tensor-parallel ranks feeds a pipelined segment on others",
          "[parallel][segments][disjoint]") {
  // The VQA layout on a decoder: blocks 0-2 on ranks 0-1 (tp 2, sequence
  // parallel), blocks 3-5 on ranks 2-5 (pp 2 × dp 2), activations and their
  // gradients streamed by send/recv.
  const ModelSpec m = tiny_llama();
  check_matches_reference(m, segmented(m, R"([
      {"blocks": [0, 2], "tp": 2, "sequence_parallel": true, "ranks": [0, 1]},
      {"blocks": [3, 5], "pp": 2, "dp": 2, "microbatches": 2, "ranks": [2, 5], "zero": 1}])"));
  // Three segments, alternating between two sets of ranks; micro-batches that straddle each other's.
  check_matches_reference(m, segmented(m, R"([
      {"blocks": [0, 1], "dp": 2, "ranks": [0, 1]},
      {"blocks": [2, 2], "tp": 2, "ranks": [2, 3], "microbatches": 8},
      {"blocks": [3, 5], "pp": 2, "ranks": [0, 1], "microbatches": 4}])"));
}

TEST_CASE("VQA: the vision encoder on a tensor-parallel group, the language model pipelined on others",
          "[parallel][segments][vqa]") {
  // experiments/plans/vqa-hetero.json's layout on vqa-tiny: encoder and
  // projector tp 2 on ranks 0-1, language model pp 4 on ranks 2-5.
  const ModelSpec m = *model_preset("vqa-tiny");
  check_matches_reference(m, segmented(m, R"([
      {"modules": ["vision", "projector"], "tp": 2, "ranks": [0, 1], "microbatches": 4},
      {"modules": ["language"], "pp": 4, "ranks": [2, 5], "microbatches": 4}])"));
  // The projector with the language model instead, its two halves tensor- and data-parallel.
  check_matches_reference(m, segmented(m, R"([
      {"modules": ["vision"], "dp": 2, "ranks": [0, 1]},
      {"modules": ["projector", "language"], "tp": 2, "dp": 2, "sequence_parallel": true, "ranks": [2, 5]}])"));
}

TEST_CASE("segments on the same ranks change tp, dp and ZeRO between them", "[parallel][segments][same]") {
  ModelSpec m = tiny_llama();
  m.name = "tiny-llama-mha";  // four kv heads: tp 4 splits them (the reference cache keys on the name)
  m.kv_heads = 4;
  check_matches_reference(m, segmented(m, R"([
      {"blocks": [0, 1], "dp": 4},
      {"blocks": [2, 3], "tp": 4, "sequence_parallel": true},
      {"blocks": [4, 5], "tp": 2, "dp": 2, "zero": 2}])"));
}
