// `meshtrain train`: real training on the cpu backend, ranks as threads of
// this process (default) or as MPI processes under mpirun/srun.
#include <memory>

#include "backends/cpu/comm/in_process.h"
#include "backends/cpu/comm/mpi_communicator.h"
#include "backends/cpu/comm/mpi_environment.h"
#include "backends/cpu/cpu_backend.h"
#include "core/names.h"
#include "engine/cli/commands.h"
#include "engine/cli/plan_flags.h"
#include "engine/trainer.h"

namespace meshtrain {

namespace {

struct TrainFlags {
  PlanFlags plan;
  TrainOptions train;
  std::string backend = "cpu";
  std::string ranks = "threads";
  double comm_timeout_s = 300;
  bool quiet = false;
};

Status run_train(TrainFlags f) {
  if (f.backend != "cpu") {
    const std::vector<std::string> valid = {"cpu"};
    return Error(unknown_name_message("training backend", f.backend, valid) +
                 "; the cuda backend trains from the cuda build, sim runs under `meshtrain simulate`");
  }
  if (f.ranks != "threads" && f.ranks != "mpi")
    return Error(unknown_name_message("--ranks", f.ranks, {"threads", "mpi"}));
  // The cpu backend computes in fp32: that is the default here, and the only choice.
  if (!f.plan.overrides.precision) f.plan.overrides.precision = "fp32";
  MT_ASSIGN(auto launch, detect_launch());
  const bool mpi = f.ranks == "mpi" || launch.has_value();
  MT_ASSIGN(ModelAndPlan mp, resolve_model_and_plan(f.plan, mpi && launch ? launch->world_size : 0));
  if (mp.plan.precision != Precision::fp32)
    return make_error("the cpu backend trains in fp32, got --precision {}; use --precision fp32",
                      precision_name(mp.plan.precision));
  f.train.progress = !f.quiet;
  f.train.step.seed = f.train.seed;
  const CommOptions comm{std::chrono::milliseconds(static_cast<long long>(f.comm_timeout_s * 1000))};

  if (mpi) {
    MT_ASSIGN(auto env, MpiEnvironment::init(nullptr, nullptr));
    if (env->world_size() != mp.plan.world_size())
      return make_error("mpirun started {} processes, the plan needs tp·pp·dp·cp = {}", env->world_size(),
                        mp.plan.world_size());
    if (env->rank() == 0) MT_TRY(check_train_options(f.train, mp.model, mp.plan));
    MT_ASSIGN(auto communicator, MpiCommunicator::create(comm));
    CpuBackend backend(*communicator);
    auto status = train_rank(backend, mp.model, mp.plan, f.train);
    // A failed rank must not leave its peers waiting: stop the whole job.
    if (!status.ok()) abort_job(status.error());
    return {};
  }
  MT_TRY(check_train_options(f.train, mp.model, mp.plan));
  if (mp.plan.world_size() == 1) {
    CpuBackend backend;
    return train_rank(backend, mp.model, mp.plan, f.train);
  }
  return run_ranks(
      mp.plan.world_size(),
      [&](int rank, Communicator& c) {
        CpuBackend backend(c);
        auto status = train_rank(backend, mp.model, mp.plan, f.train);
        if (!status.ok()) status.context(fmt::format("rank {}", rank));
        return status;
      },
      comm);
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  CLI::App* sub = app.add_subcommand("train", "train a model on a text file (byte tokens) with a parallel plan");
  add_plan_flags(*sub, f->plan, "tiny");
  TrainOptions& t = f->train;
  sub->add_option("--data", t.data, "training text: any file, its bytes are the tokens")->required();
  sub->add_option("--backend", f->backend, "cpu")->capture_default_str();
  sub->add_option("--steps", t.steps, "optimizer steps")->capture_default_str();
  sub->add_option("--lr", t.lr, "peak learning rate")->capture_default_str();
  sub->add_option("--min-lr", t.min_lr, "learning rate at the end of the cosine decay")->capture_default_str();
  sub->add_option("--warmup", t.warmup, "linear warm-up steps")->capture_default_str();
  sub->add_option("--seed", t.seed, "seed of initialisation, data order and dropout")->capture_default_str();
  sub->add_option("--checkpoint", t.checkpoint_dir, "checkpoint directory");
  sub->add_option("--checkpoint-every", t.checkpoint_every, "steps between checkpoints (0: at the end only)");
  sub->add_flag("--resume", t.resume, "continue from the checkpoint in --checkpoint if there is one");
  sub->add_option("--stop-at", t.stop_at, "stop after this step, as a preemption would (checkpointed)");
  sub->add_option("--metrics", t.metrics, "append one JSON object per step to this file");
  sub->add_option("--eval-every", t.eval_every, "steps between validation losses (0: none)");
  sub->add_option("--eval-sequences", t.eval_sequences, "validation sequences per evaluation")->capture_default_str();
  sub->add_option("--dropout", t.step.dropout, "dropout probability")->capture_default_str();
  sub->add_option("--weight-decay", t.step.optimizer.weight_decay, "AdamW weight decay")->capture_default_str();
  sub->add_option("--grad-clip", t.step.optimizer.max_grad_norm, "clip gradients to this global norm (0: off)")
      ->capture_default_str();
  sub->add_option("--ranks", f->ranks, "threads (one process) or mpi (under mpirun/srun)")->capture_default_str();
  sub->add_option("--comm-timeout", f->comm_timeout_s, "seconds a rank waits for its peers before failing")
      ->capture_default_str();
  sub->add_flag("--quiet", f->quiet, "no progress lines");
  return {sub, [f] { return run_train(*f); }};
}

}  // namespace meshtrain
