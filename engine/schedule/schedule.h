// Pipeline schedules as data: the layout, the actions a pipeline rank runs, and
// their text form. Nothing here knows a backend, a model or the mesh; a
// schedule is a value that builders produce, passes rewrite, validators check
// and the trainer executes in list order.
//
// Legend used in every file of this folder:
//   p  stages (pipeline ranks)          v  model chunks per stage (vpp)
//   m  microbatches                     V  virtual stages = p·v
//   s  virtual stage, 0..V-1            j  microbatch, 0..m-1
// Virtual stage s is model chunk c = s / p on rank r = s % p, i.e.
// s = c·p + r, as in Megatron-LM's interleaved schedule: rank r holds layer
// blocks r, r+p, r+2p, ... so activations hop rank 0 → 1 → ... → p-1 → 0 ...
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace meshtrain::schedule {

struct PipelineLayout {
  int stages = 1;            // p
  int chunks_per_stage = 1;  // v
  int microbatches = 1;      // m

  int virtual_stages() const { return stages * chunks_per_stage; }
  bool operator==(const PipelineLayout&) const = default;
};

// Positive sizes; says which number is wrong.
Status check_layout(const PipelineLayout& layout);

// One step of one pipeline rank. A communication action is named after the
// local (chunk, microbatch) whose data it carries:
//   send_act  (r, c, j): send the output of forward (c, j) to virtual stage s+1
//   recv_act  (r, c, j): receive the input of forward (c, j) from stage s-1
//   send_grad (r, c, j): send the input gradient of backward (c, j) to s-1
//   recv_grad (r, c, j): receive the output gradient of backward (c, j) from s+1
// so the peer of any communication action follows from the layout.
struct Action {
  // Zero-bubble schedules split backward in two: `backward` (B) then gives
  // the input gradient only, and `weight` (W) the parameter gradients of the
  // same (chunk, micro-batch), later on the same rank.
  enum Kind { forward, backward, send_act, recv_act, send_grad, recv_grad, weight };
  Kind kind = forward;
  int stage = 0;  // pipeline rank r that runs it
  int chunk = 0;  // model chunk c on that rank
  int microbatch = 0;

  bool is_compute() const { return kind == forward || kind == backward || kind == weight; }
  bool operator==(const Action&) const = default;
};

inline int virtual_stage(const PipelineLayout& layout, const Action& a) {
  return a.chunk * layout.stages + a.stage;
}

// Per pipeline rank the actions it runs, in order. Builders emit compute
// actions only; insert_communication adds the sends and receives.
struct Schedule {
  PipelineLayout layout;
  std::vector<std::vector<Action>> ranks;  // [r][step]

  bool operator==(const Schedule&) const = default;
};

// Text form, after PyTorch's `2F0`:
//   action := stage kind microbatch [ "." chunk ]
//   kind   := "F" | "B" | "SA" | "RA" | "SG" | "RG"
// stage, microbatch and chunk are decimal; the chunk suffix is written only
// when the chunk is not 0, so non-interleaved schedules read as plain `2F0`.
//   "2F3"    rank 2, forward of microbatch 3, chunk 0
//   "1B3.1"  rank 1, backward of microbatch 3, chunk 1
//   "0SA5.1" rank 0 sends the activation of (chunk 1, microbatch 5)
// A cell of a grid row drops the stage (the row names it): "F3", "RG5.1".
std::string format_action(const Action& a);
std::string format_cell(const Action& a);
// Parses the full form. Errors name the offending token.
Result<Action> parse_action(std::string_view token);

// The grid: one line per rank, `rank R: ` then its cells in list order, each
// column padded to its widest cell so equal steps line up:
//   rank 0: F0 F1 B0 B1
//   rank 1: F0 B0 F1 B1
std::string format_schedule(const Schedule& schedule);
// Reads the grid back; the layout supplies the sizes (the text carries none)
// and every action is range-checked against it. Errors name line and token.
Result<Schedule> parse_schedule(const PipelineLayout& layout, std::string_view text);

// Lays out labelled rows of cells as columns padded to their widest cell;
// shared by format_schedule and the dry run's deadlock report.
std::string format_grid(const std::vector<std::string>& labels,
                        const std::vector<std::vector<std::string>>& cells);

}  // namespace meshtrain::schedule
