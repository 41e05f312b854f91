// A model's blocks and parameter table, built once and shared by the code
// that asks for them over and over: the memory model (memory_per_rank,
// count_shard_parameters) and plan validation run for every candidate of a
// planner search, and rebuilding the table each time (a few allocations per
// parameter tensor: names, shapes) was most of the search's CPU time.
//
// model_tables(m) returns the tables of a spec equal to m field by field, so
// a changed spec never sees stale tables. Each
// thread keeps the tables of the last model it asked about and rebuilds them
// when asked about another: nothing is shared between threads, so no lock.
// The tables never change once built; the shared_ptr keeps them alive for a
// caller while its thread moves on to another model.
#pragma once

#include <memory>
#include <vector>

#include "models/block.h"
#include "models/model_spec.h"
#include "models/parameters.h"

namespace meshtrain {

// Consecutive hook layers [begin, end) whose tensors are alike, in order
// (split, expert, size, embedding role): the tensors of the run's first
// layer, by index into ModelTables::parameters. count_shard_parameters sums
// one layer of a run and multiplies, so a deep model's memory model costs
// its runs and stages, not its every tensor, per candidate plan.
struct LayerRun {
  int begin = 0, end = 0;
  std::vector<std::size_t> tensors;
};

struct ModelTables {
  ModelBlocks blocks;                 // model_blocks(m)
  std::vector<ParamInfo> parameters;  // parameter_table(m)
  ParamCount count;                   // count_parameters(m)
  std::vector<LayerRun> runs;         // the parameters by runs of alike layers, in layer order
};

std::shared_ptr<const ModelTables> model_tables(const ModelSpec& m);

}  // namespace meshtrain
