// Makespan and bubble of a compute schedule on uniform stages, by simulating
// its dependency graph: each rank runs its row in order; forward (s, j) starts
// when the rank is free and forward (s-1, j) has finished; backward (s, j)
// when the rank is free, forward (s, j) and backward (s+1, j) have finished.
// Communication is free and just in time (as insert_communication places it),
// so the input is the compute schedule a builder returns.
//
// Bubble fraction: the idle share of the pipeline's time,
//   bubble = (p·T - Σ_r busy_r) / (p·T),  T the makespan,
// which on uniform stages is each rank's idle time over T.
//
// Closed forms, with f, b the per-chunk forward and backward times of one
// microbatch. In all three schedules the last rank waits (p-1)·f for the
// first activation to cross the pipe, then — if it never waits again — runs
// its m·v forwards and backwards back to back, after which the last gradient
// needs (p-1)·b to drain back to rank 0 (if the ranks it crosses are free):
//   T = (p-1)·f + m·v·(f+b) + (p-1)·b = (m·v+p-1)·(f+b)
// Every rank is busy m·v·(f+b), so
//   bubble = (p-1)·(f+b) / T = (p-1)/(m·v+p-1)        (v = 1: GPipe, 1F1B)
// against the Megatron-LM paper's bubble / ideal time = (p-1)/(m·v), the
// same idle time measured against busy time instead of T. For GPipe the
// "never waits" steps are plain (all forwards then all backwards, each in
// microbatch order). For 1F1B and interleaved it holds because the steady
// state hands the last rank the next forward before it finishes a backward;
// the tests confirm T exactly for p ≤ 8, v ≤ 4, m ≤ 40 (m % p = 0 when
// interleaved) and b/f from 0.25 to 3.
#pragma once

#include <vector>

#include "engine/schedule/schedule.h"

namespace meshtrain::schedule {

struct Timing {
  double makespan = 0;         // T
  std::vector<double> busy;    // [r] compute time of rank r
  double bubble_fraction = 0;  // (p·T - Σ busy) / (p·T)
};

// forward, backward: time of one microbatch through one chunk (> 0). An
// Error if the schedule has communication actions or can never finish (a
// dependency cycle or a missing action); it names the stuck actions.
// A zero-bubble schedule's weight passes (W) take `weight` each, after their backward (B).
Result<Timing> simulate_timing(const Schedule& compute, double forward, double backward, double weight = 0);

// (p-1)/(m·v+p-1): the closed form above for all three schedules.
double bubble_fraction_formula(const PipelineLayout& layout);

}  // namespace meshtrain::schedule
