// LrSchedule: linear warm-up, then cosine decay, as GPT-2/nanoGPT train.
//
// Steps are 1-based (step 1 is the first optimizer update). With W = warmup and
// N = total:
//   step <= W:      lr · step / W                      (step 1 gets lr / W, step W gets lr)
//   W < step <= N:  min_lr + (lr - min_lr) · ½ · (1 + cos(π · (step - W) / (N - W)))
//                   (continuous at W: gives lr there; reaches min_lr exactly at step N)
//   step > N:       min_lr
// With W = 0 there is no warm-up and step 1 is already on the cosine.
#pragma once

#include "core/status.h"

namespace meshtrain {

struct LrSchedule {
  double lr = 0;      // peak learning rate
  double min_lr = 0;  // floor reached at `total`
  int warmup = 0;     // W
  int total = 0;      // N
};

// Rejects negative rates, min_lr > lr, warmup < 0, total < 1 and warmup > total.
Status validate_lr_schedule(const LrSchedule& s);

// The learning rate of 1-based `step` (see the formula above); step >= 1.
double lr_at(const LrSchedule& s, int step);

}  // namespace meshtrain
