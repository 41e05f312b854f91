// LrSchedule: linear warm-up, then a decay to min_lr of one of four shapes.
//
// Steps are 1-based (step 1 is the first optimizer update). With W = warmup,
// N = total and D = decay steps (decay_steps, or its default below):
//   step <= W:  lr · step / W        (step 1 gets lr / W, step W gets lr; W = 0: no warm-up)
// then, with t = (step - W) / D the fraction of the decay done (capped at 1):
//   cosine:    min_lr + (lr - min_lr) · ½ · (1 + cos(π · t))   GPT-2/nanoGPT, Megatron's default
//   linear:    min_lr + (lr - min_lr) · (1 - t)
//   constant:  lr                                              (min_lr unused)
//   wsd:       warm-up, stable at lr, then linear to min_lr over the last D steps
//              (warmup-stable-decay: MiniCPM, Hägele et al. 2024), t = (step - (N - D)) / D
// cosine and linear decay over D = N - W steps by default (reaching min_lr at
// step N), wsd over the last D = ceil((N - W) / 5) (a 20% cool-down). After
// the decay the rate stays at min_lr. All shapes are continuous at W.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace meshtrain {

enum class LrDecay { cosine, linear, constant, wsd };

// "cosine", "linear", "constant", "wsd"; an unknown name suggests the nearest.
Result<LrDecay> parse_lr_decay(std::string_view name);
std::string lr_decay_name(LrDecay d);

struct LrSchedule {
  double lr = 0;      // peak learning rate
  double min_lr = 0;  // floor reached at the end of the decay
  int warmup = 0;     // W
  int total = 0;      // N
  LrDecay decay = LrDecay::cosine;
  int decay_steps = 0;  // D; 0: the shape's default (above)
};

// Rejects negative rates, min_lr > lr, warmup < 0, total < 1, warmup > total,
// and decay steps that do not fit after the warm-up (D > N - W).
Status validate_lr_schedule(const LrSchedule& s);

// D: s.decay_steps, or the shape's default.
int decay_steps(const LrSchedule& s);

// The learning rate of 1-based `step` (see the formulas above); step >= 1.
double lr_at(const LrSchedule& s, int step);

}  // namespace meshtrain
