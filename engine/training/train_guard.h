// What a training run guards against, before it starts and while it runs,
// so that bad input or an interruption never costs what was checkpointed:
//
//  * the host memory the run needs, estimated before anything is allocated;
//  * a resumed checkpoint that does not fit this run (other data: an Error;
//    a new learning rate or length: a warning), which the checkpoint's record
//    of its run (run_record) makes checkable;
//  * a stop requested by SIGTERM or SIGINT (engine/training/stop_request.h), which
//    every rank must act on after the same step: StopVote.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/plan/mesh.h"
#include "engine/plan/plan.h"
#include "engine/training/trainer.h"
#include "models/model_spec.h"

namespace meshtrain {

// "meshtrain train: warning: ..." on stderr (after flushing stdout's progress).
void warn(std::string_view message);

// An Error with the figure unless `host_ranks` ranks of this run fit in this
// machine's memory (see check_train_options in engine/training/trainer.h).
Status check_train_memory(const TrainOptions& o, const ModelSpec& m, const Plan& p, int host_ranks);

// `status`, and when it is a backend's allocation failure
// (backends/allocation_failure.h) on `rank`, the memory model's estimate for
// that rank: its peak and largest consumer, and with `host_ranks` > 0 (ranks
// on this machine's memory) the machine's capacity and what to try.
Status explain_allocation_failure(Status status, const TrainOptions& o, const ModelSpec& m, const Plan& p, int rank,
                                  int host_ranks);

// What a checkpoint records of the run beside model and plan: the data (path,
// size and crc32: other data makes the loader's saved position meaningless)
// and the knobs of the schedule and the optimizer.
nlohmann::json run_record(const TrainOptions& o, const std::string& data_path, std::span<const std::uint8_t> data);

// Checks a checkpoint against this run before resuming it: an Error where
// continuing would be wrong (other data; --steps or --stop-at already
// passed; other AdamW betas, epsilon or decayed parameters, which the
// moments were accumulated under), a warning (on the leader) where it is
// legitimate (a new learning rate, schedule shape, length, dropout, ...).
Status check_resume(const CheckpointMeta& meta, const TrainOptions& o, const nlohmann::json& run, bool leader);

// The ranks' agreement to stop: each rank calls agree() after every step
// (a one-element all-reduce over all ranks of `world` when there are several),
// and all get the same answer, so they stop after the same step.
class StopVote {
 public:
  StopVote(Backend& b, Group world);
  // The signal a stop was requested by on any rank (the largest number,
  // should ranks have had different ones), or 0. Also records it locally
  // (request_stop), so that main reports it on every rank's process.
  Result<int> agree();
  // Blocks until every rank got here: no rank leaves before the leader's
  // last checkpoint is committed.
  Status barrier();

 private:
  Backend& b_;
  Group world_;
  Tensor flag_;  // (1)
};

}  // namespace meshtrain
