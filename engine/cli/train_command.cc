// `meshtrain train`: real training on the cpu backend (ranks as threads of
// this process by default, or as MPI processes under mpirun/srun) or on the
// cuda backend (one rank per process: alone, or under mpirun/srun). With
// --trace every rank's backend is wrapped in a TracingBackend.
#include <chrono>
#include <functional>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "backends/comm/launch.h"
#include "backends/comm/mpi_environment.h"
#include "core/input_file.h"
#include "core/last_words.h"
#include "core/names.h"
#include "engine/cli/backend_registry.h"
#include "engine/cli/bounded_flags.h"
#include "engine/cli/commands.h"
#include "engine/cli/plan_flags.h"
#include "engine/data/tokenizer.h"
#include "engine/export/hf_export.h"
#include "engine/parallel/weight_decay.h"
#include "engine/tracing/mpi_trace.h"
#include "engine/tracing/tracing_backend.h"
#include "engine/training/lr_schedule.h"
#include "engine/training/stop_request.h"
#include "engine/training/train_guard.h"
#include "engine/training/trainer.h"

namespace meshtrain {

namespace {

struct TrainFlags {
  PlanFlags plan;
  TrainOptions train;
  std::string backend = "cpu";
  std::string ranks = "threads";
  double comm_timeout_s = 300;
  std::string trace;  // empty: no trace
  bool quiet = false;
  int threads = 0;  // cpu threads per rank; 0: the process's cores shared out among its ranks
  std::vector<std::string> faults;  // --fault-inject specs (engine/training/fault_injection.h)
  std::string tokenizer;  // --tokenizer: the SentencePiece model the --data tokens were made with
  // AdamW: a flag not given takes a resumed checkpoint's value, else OptimizerOptions' default.
  std::optional<double> beta1, beta2, eps;
  std::optional<std::string> decayed;
  std::string lr_decay = "cosine";
  std::optional<double> peak_tflops;  // per rank, for the run summary's MFU
};

// The optimizer settings of the run: each flag given, else (resuming) the
// value the checkpoint's run record holds, else the default. Every rank
// resolves them alike: each reads the manifest, as each loads the checkpoint.
Status resolve_optimizer(TrainFlags& f) {
  nlohmann::json recorded = nlohmann::json::object();
  if (f.train.resume && !f.train.checkpoint_dir.empty() && has_checkpoint(f.train.checkpoint_dir)) {
    MT_ASSIGN(const CheckpointManifest m, read_checkpoint_manifest(f.train.checkpoint_dir));
    if (m.meta.run.is_object()) recorded = m.meta.run;
  }
  OptimizerOptions& o = f.train.step.optimizer;
  auto pick = [&recorded](const std::optional<double>& flag, const char* key, float& out) {
    if (flag) out = static_cast<float>(*flag);
    else if (recorded.contains(key) && recorded[key].is_number()) out = recorded[key].get<float>();
  };
  pick(f.beta1, "adam_beta1", o.beta1);
  pick(f.beta2, "adam_beta2", o.beta2);
  pick(f.eps, "adam_eps", o.eps);
  std::string decayed = decayed_params_name(o.decayed);
  if (f.decayed) decayed = *f.decayed;
  else if (recorded.contains("weight_decay_params") && recorded["weight_decay_params"].is_string())
    decayed = recorded["weight_decay_params"].get<std::string>();
  MT_ASSIGN(o.decayed, parse_decayed_params(decayed));
  MT_ASSIGN(f.train.lr_decay, parse_lr_decay(f.lr_decay));
  return ok_status();
}

// All ranks' peak FLOP/s for the summary's MFU: --peak-tflops per rank; else
// on the cpu backend with ranks as threads, this process's cores at the
// local-cpu preset's per-core rate; else unknown (0).
void set_peak(TrainFlags& f, const Plan& p, bool cuda, bool mpi) {
  if (f.peak_tflops) {
    f.train.peak_flops = *f.peak_tflops * 1e12 * p.world_size();
    f.train.peak_source = fmt::format("--peak-tflops {:g} x {} ranks", *f.peak_tflops, p.world_size());
  } else if (!cuda && !mpi) {
    // The local-cpu preset: 2.6 GHz, two 8-wide fp32 FMAs a cycle (32 FLOP/cycle) per core.
    constexpr double kCoreFlops = 2.6e9 * 32;
    const int cores = available_cpu_cores();
    f.train.peak_flops = kCoreFlops * cores;
    f.train.peak_source = fmt::format("{} cores x {:.0f} GFLOP/s, the local-cpu preset's rate; --peak-tflops to "
                                      "set it", cores, kCoreFlops / 1e9);
  }
}

// --tokenizer's pieces, which must all be ids the model can embed.
Result<int> tokenizer_vocab(const std::string& path, const ModelSpec& m) {
  Result<Tokenizer> loaded = Tokenizer::load(path);
  if (!loaded.ok()) return std::move(loaded.context("--tokenizer")).error();
  const Tokenizer& t = *loaded;
  if (t.vocab_size() > m.vocab)
    return make_error("--tokenizer '{}' has {} pieces, but model '{}' has vocab {}, so its ids past {} have no "
                      "embedding; use a model with \"vocab\" of at least {}, or train the tokenizer with "
                      "--vocab-size {} or less",
                      path, t.vocab_size(), m.name, m.vocab, m.vocab - 1, t.vocab_size(), m.vocab);
  return t.vocab_size();
}

// The tokenizer the run's checkpoints record (after its directory is
// claimed): --tokenizer, copied in; or, resuming without --tokenizer, the one
// the checkpoint recorded. Resuming with another tokenizer than the recorded
// one is refused: the model's ids would mean other pieces.
Result<std::optional<CheckpointTokenizer>> run_tokenizer(const TrainOptions& o, const std::string& tokenizer,
                                                         int vocab) {
  std::optional<CheckpointTokenizer> recorded;
  if (o.resume && has_checkpoint(o.checkpoint_dir)) {
    MT_ASSIGN(const CheckpointManifest m, read_checkpoint_manifest(o.checkpoint_dir));
    recorded = m.meta.tokenizer;
  }
  if (tokenizer.empty()) return recorded;
  if (recorded) {
    MT_ASSIGN(const std::string bytes, read_input_file(tokenizer, "tokenizer model"));
    const std::uint32_t crc = checkpoint_crc32(
        {reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()});
    if (bytes.size() != recorded->bytes || crc != recorded->crc32)
      return make_error("the checkpoint in '{}' was trained with tokenizer '{}' ({} bytes, crc32 {:#010x}), but "
                        "--tokenizer '{}' is another file ({} bytes, crc32 {:#010x}); resume with the same "
                        "tokenizer, or start a new run in another --checkpoint directory",
                        o.checkpoint_dir, recorded->source, recorded->bytes, recorded->crc32, tokenizer,
                        bytes.size(), crc);
    return recorded;
  }
  MT_ASSIGN(CheckpointTokenizer t, install_checkpoint_tokenizer(o.checkpoint_dir, tokenizer, vocab));
  return std::optional<CheckpointTokenizer>(std::move(t));
}

// --init-from's parameters, read once for this process's ranks; not read when
// the run resumes a checkpoint (which takes precedence), so a job script can
// keep the flag after a preemption even if the file has gone.
Status load_init_from(TrainOptions& o, const ModelSpec& m) {
  if (o.init_from.empty() || (o.resume && has_checkpoint(o.checkpoint_dir))) return {};
  MT_ASSIGN(ParamMap params, load_hf_parameters(o.init_from, m).context("--init-from"));
  o.init_parameters = std::make_shared<const ParamMap>(std::move(params));
  return {};
}

// The precisions a backend trains in: the cpu backend computes in fp32, and
// trains fp8 as exact emulation of its FP8 GEMMs (engine/step/fp8_training.h);
// the cuda backend in fp32 or bf16 (fp32 master weights and optimizer state).
// fp16 would need loss scaling, which the trainer does not do.
// `source` names where the precision came from (the flag or the plan file):
// a plan's precision is trained in as given, or refused, never changed.
Status check_precision(const std::string& backend, Precision p, const std::string& source) {
  if (backend == "cpu" && p != Precision::fp32 && p != Precision::fp8)
    return make_error("{} asks for {}, but the cpu backend trains in fp32 only (and fp8, as emulation); train it "
                      "with --precision fp32 (the flag overrides the plan file), or on --backend cuda",
                      source, precision_name(p));
  // cuBLASLt's FP8 GEMMs (sm_90) are not wired up: no GPU was at hand to verify them.
  if (backend == "cuda" && p == Precision::fp8)
    return make_error("{} asks for fp8, which the cuda backend does not train: it has no FP8 GEMMs (cuBLASLt's "
                      "FP8 matmul on sm_90 with per-tensor scales is not implemented); train with --precision "
                      "bf16, or emulate fp8 exactly with --backend cpu",
                      source);
  if (p == Precision::fp16)
    return make_error("{} needs loss scaling, which the trainer does not do; use --precision bf16 or fp32", source);
  return ok_status();
}

// Where the run's precision comes from: the flag, the plan file, or neither
// (nullopt: the backend's default applies).
Result<std::optional<std::string>> precision_source(const PlanFlags& f) {
  if (f.overrides.precision) return std::optional<std::string>(fmt::format("--precision {}", *f.overrides.precision));
  if (f.plan_file.empty()) return std::optional<std::string>();
  MT_ASSIGN(const PlanOverrides file, plan_overrides_from_file(f.plan_file));
  if (!file.precision) return std::optional<std::string>();
  return std::optional<std::string>(fmt::format("plan file '{}' (\"precision\": \"{}\")", f.plan_file, *file.precision));
}

// The trace collected so far goes to `path` whatever `status` says (a trace
// of a failed run shows where it failed); the run's own error comes first.
Status finish_trace(Status status, const std::optional<TraceRecorder>& recorder,
                    const std::string& path) {
  if (!recorder) return status;
  Status written = recorder->write(path);
  return status.ok() ? written : status;
}

// The run's launch: MPI processes (under mpirun or srun, or --ranks mpi) or rank threads.
struct TrainLaunch {
  bool cuda = false, mpi = false;
};

// The flags checked against each other, the model and plan resolved (at
// the launcher's world size under MPI), and everything refused that this
// backend cannot train.
Result<ModelAndPlan> resolve_training(TrainFlags& f, TrainLaunch& launch_out) {
  if (Status known = check_backend_name(f.backend); !known.ok())
    return Error(known.error().message() + "; the sim backend runs under `meshtrain simulate`");
  const bool cuda = f.backend == "cuda";
  if (f.ranks != "threads" && f.ranks != "mpi")
    return Error(unknown_name_message("--ranks", f.ranks, {"threads", "mpi"}));
  // fp32 is the cpu backend's default (and only choice); cuda keeps the plan's (bf16). A precision
  // given by the flag or the plan file is honoured or refused.
  MT_ASSIGN(const std::optional<std::string> precision_from, precision_source(f.plan));
  if (!cuda && !precision_from) f.plan.overrides.precision = "fp32";
  MT_ASSIGN(auto launch, detect_launch());
  const bool mpi = f.ranks == "mpi" || launch.has_value();
  MT_ASSIGN(ModelAndPlan mp, resolve_model_and_plan(f.plan, mpi && launch ? launch->world_size : 0));
  MT_TRY(check_precision(f.backend, mp.plan.precision, precision_from.value_or("the default")));
  // bf16 gradient buffers are a simulated plan fact: the cpu backend holds fp32 tensors only, and the cuda
  // kernels that accumulate into gradients or read them (GEMM epilogues, norms, embeddings, AdamW) have not
  // been run in bf16 on a GPU.
  if (mp.plan.grad_dtype != GradDtype::fp32)
    return make_error("the plan keeps gradients in {} (grad_dtype), which meshtrain trains in fp32 only: train with "
                      "--grad-dtype fp32 (the flag overrides the plan file), or time the plan with `meshtrain "
                      "simulate`",
                      grad_dtype_name(mp.plan.grad_dtype));
  // The emulation keeps every parameter in the working dtype: an FP8 parameter's values (FP8 codes times
  // a per-tensor fp32 scale) are not all representable there.
  if (mp.plan.fp8_param_gather)
    return make_error("the plan keeps the FP8 linears' weights as FP8 parameters (fp8_param_gather), which "
                      "meshtrain does not train: train without --fp8-param-gather (drop it from the plan file), or "
                      "time the plan with `meshtrain simulate`");
  MT_TRY(resolve_optimizer(f));
  set_peak(f, mp.plan, cuda, mpi);
  // The cuda flash kernels mask causally or not at all and normalise over the keys only.
  if (cuda && (mp.model.sliding_window > 0 || mp.model.attention_sinks))
    return make_error("model '{}' has {}; the cuda attention kernels implement neither: train it with --backend cpu "
                      "or simulate it", mp.model.name,
                      mp.model.sliding_window > 0 ? "a sliding window" : "attention sinks");
  MT_TRY(load_init_from(f.train, mp.model));
  if (cuda && !mpi && mp.plan.world_size() > 1)
    return make_error("the cuda backend runs one rank per process, and this plan has {} ranks; launch "
                      "them with `mpirun -np {} meshtrain train ...` or srun",
                      mp.plan.world_size(), mp.plan.world_size());
  launch_out = {cuda, mpi};
  return mp;
}

// The training options the flags leave to derive: progress, seed, FP8
// emulation, the injected faults (checked against the world), the ranks'
// launch and the communication timeout.
Status set_train_options(TrainFlags& f, const ModelAndPlan& mp, bool mpi, std::chrono::milliseconds timeout) {
  f.train.progress = !f.quiet;
  f.train.step.seed = f.train.seed;
  f.train.step.emulate_fp8 = mp.plan.precision == Precision::fp8;  // the cpu backend: cuda refused it
  for (const std::string& spec : f.faults) {
    MT_ASSIGN(Fault fault, parse_fault(spec));
    if (fault.rank >= mp.plan.world_size())
      return make_error("--fault-inject '{}': rank {} is outside the world of {} ranks", spec, fault.rank,
                        mp.plan.world_size());
    f.train.faults.push_back(fault);
  }
  f.train.ranks_are_processes = mpi;
  f.train.rank_losses = std::make_shared<RankLosses>();
  f.train.comm_timeout = timeout;
  return ok_status();
}

// The run's guards, then the checkpoint directory claimed and the tokenizer
// run (by the one process that writes checkpoints).
Status claim_run(TrainFlags& f, const ModelAndPlan& mp, int host_ranks, std::optional<CheckpointLock>& lock) {
  MT_TRY(check_train_options(f.train, mp.model, mp.plan, host_ranks));
  MT_ASSIGN(const int tokenizer_pieces, f.tokenizer.empty() ? Result<int>(0) : tokenizer_vocab(f.tokenizer, mp.model));
  MT_ASSIGN(lock, claim_checkpoint(f.train));
  if (lock) {
    MT_ASSIGN(f.train.tokenizer, run_tokenizer(f.train, f.tokenizer, tokenizer_pieces));
  }
  return ok_status();
}

using TrainOn = std::function<Status(Backend&)>;

// This process's rank of an MPI job. A failed rank must not leave its peers
// waiting: any failure but an agreed stop ends the whole job.
Status train_mpi(TrainFlags& f, const ModelAndPlan& mp, const BackendRequest& backends, int host_ranks,
                 std::optional<TraceRecorder>& recorder, const TrainOn& train_on) {
  MT_ASSIGN(auto env, MpiEnvironment::init(nullptr, nullptr));
  if (env->world_size() != mp.plan.world_size())
    return make_error("mpirun started {} processes, the plan needs tp·pp·dp·cp = {}", env->world_size(),
                      mp.plan.world_size());
  // After MPI_Init: a crash's line comes first, then Open MPI's backtrace. Only the ranks' lines can
  // place a death in a step, since mpirun names the process but not where it was.
  last_words::set_process_rank(env->rank());
  last_words::announce_stops(true);
  last_words::install_fatal_handlers();
  std::optional<CheckpointLock> lock;  // rank 0 writes the checkpoints and holds their directory
  if (env->rank() == 0) MT_TRY(claim_run(f, mp, host_ranks, lock));
  // Rank 0 writes the one trace of every rank (mpi_trace.h).
  if (recorder && env->rank() == 0)
    if (Status s = TraceRecorder::probe(f.trace); !s.ok()) abort_job(s.error());
  auto rank = MpiRankBackend::create(backends);
  if (!rank.ok()) abort_job(rank.error());
  // The rank and the step a failure stopped at, as under threads.
  Status trained = train_on(rank->backend());
  if (!trained.ok()) trained.context(fmt::format("rank {}", env->rank()));
  Status status = f.train.rank_losses->summarize(std::move(trained), f.train.steps);
  std::string trace_sent;  // outlives abort_job: a send rank 0 never took may still read it
  if (recorder) {
    Status written = write_mpi_trace(*env, *recorder, f.trace, backends.comm_timeout, trace_sent);
    if (status.ok()) status = std::move(written);
  }
  if (!status.ok() && stop_signal() == 0) abort_job(status.error());
  return status;
}

// Every rank in this process: one, or one thread per rank.
Status train_threads(TrainFlags& f, const ModelAndPlan& mp, const BackendRequest& backends, int host_ranks,
                     std::optional<TraceRecorder>& recorder, const TrainOn& train_on) {
  std::optional<CheckpointLock> lock;
  MT_TRY(claim_run(f, mp, host_ranks, lock));
  if (recorder) MT_TRY(TraceRecorder::probe(f.trace));
  // A crash names the rank thread it happened on (one rank: the process is it).
  if (mp.plan.world_size() == 1) last_words::set_process_rank(0);
  last_words::install_fatal_handlers();
  if (mp.plan.world_size() == 1) {
    MT_ASSIGN(std::unique_ptr<Backend> backend, make_backend(backends));
    return finish_trace(train_on(*backend), recorder, f.trace);
  }
  Status status = run_thread_ranks(backends, mp.plan.world_size(), [&](int rank, Backend& backend) {
    auto status = train_on(backend);
    if (!status.ok()) status.context(fmt::format("rank {}", rank));
    return status;
  });
  status = f.train.rank_losses->summarize(std::move(status), f.train.steps);
  return finish_trace(std::move(status), recorder, f.trace);
}

Status run_train(TrainFlags f) {
  TrainLaunch launch;
  MT_ASSIGN(const ModelAndPlan mp, resolve_training(f, launch));
  install_stop_handlers();
  last_words::set_checkpoint_dir(f.train.checkpoint_dir);
  const auto timeout = std::chrono::milliseconds(static_cast<long long>(f.comm_timeout_s * 1000));
  MT_TRY(set_train_options(f, mp, launch.mpi, timeout));
  const BackendRequest backends{.name = f.backend, .threads = f.threads, .comm_timeout = timeout};
  std::optional<TraceRecorder> recorder;
  if (!f.trace.empty()) recorder.emplace();
  // Ranks whose memory is this machine's: the rank threads, or this MPI process (none on cuda).
  const int host_ranks = launch.cuda ? 0 : launch.mpi ? 1 : mp.plan.world_size();
  // Trains one rank on `b`, through a TracingBackend when tracing; the
  // wrapper hands its events to the recorder when it goes out of scope here.
  const TrainOn train_on = [&](Backend& b) -> Status {
    Status status = ok_status();
    if (!recorder) {
      status = train_rank(b, mp.model, mp.plan, f.train);
    } else {
      TracingBackend traced(b, *recorder);
      status = train_rank(traced, mp.model, mp.plan, f.train);
    }
    return explain_allocation_failure(std::move(status), f.train, mp.model, mp.plan, b.rank(), host_ranks);
  };
  return launch.mpi ? train_mpi(f, mp, backends, host_ranks, recorder, train_on)
                    : train_threads(f, mp, backends, host_ranks, recorder, train_on);
}

constexpr IntRange kSteps{1, 1 << 30};

// --steps, the learning-rate schedule, AdamW and its regularisation.
void add_optimizer_flags(CLI::App* sub, TrainFlags* f) {
  TrainOptions& t = f->train;
  const RealRange kRate{0, std::numeric_limits<double>::max(), true};
  sub->add_option("--steps", t.steps, "optimizer steps")->capture_default_str()->check(int_in(kSteps));
  sub->add_option("--lr", t.lr, "peak learning rate")->capture_default_str()->check(real_in(kRate));
  sub->add_option("--min-lr", t.min_lr, "learning rate at the end of the decay")
      ->capture_default_str()
      ->check(real_in({0, std::numeric_limits<double>::max()}));
  sub->add_option("--warmup,--warmup-steps", t.warmup, "linear warm-up steps (default 10, at most --steps)")
      ->check(int_in({0, 1 << 30}));
  sub->add_option("--lr-decay", f->lr_decay,
                  "the learning rate after the warm-up: cosine or linear to --min-lr, constant, or wsd (stable, then "
                  "linear to --min-lr over the last --decay-steps)")
      ->capture_default_str();
  sub->add_option("--decay-steps", t.decay_steps,
                  "steps of the decay (0: cosine and linear to the last step, wsd the last 20% after the warm-up)")
      ->capture_default_str()
      ->check(int_in({0, 1 << 30}));
  const OptimizerOptions adam;
  sub->add_option("--adam-beta1", f->beta1, "AdamW's first-moment decay (resuming: the checkpoint's)")
      ->default_str(fmt::format("{:g}", adam.beta1))
      ->check(real_in(kAdamBetaRange));
  sub->add_option("--adam-beta2", f->beta2, "AdamW's second-moment decay (resuming: the checkpoint's)")
      ->default_str(fmt::format("{:g}", adam.beta2))
      ->check(real_in(kAdamBetaRange));
  sub->add_option("--adam-eps", f->eps, "AdamW's epsilon (resuming: the checkpoint's)")
      ->default_str(fmt::format("{:g}", adam.eps))
      ->check(real_in(kAdamEpsRange));
  sub->add_option("--weight-decay-params", f->decayed,
                  "what --weight-decay applies to: linear (the linear layers' weights), linear+embeddings, or all "
                  "(norms and biases too) (resuming: the checkpoint's)")
      ->default_str(decayed_params_name(adam.decayed));
  sub->add_option("--dropout", t.step.dropout, "dropout probability")
      ->capture_default_str()
      ->check(real_in(kDropoutRange));
  sub->add_option("--weight-decay", t.step.optimizer.weight_decay,
                  "AdamW's decoupled weight decay (see --weight-decay-params)")
      ->capture_default_str()
      ->check(real_in(kWeightDecayRange));
  sub->add_option("--grad-clip", t.step.optimizer.max_grad_norm, "clip gradients to this global norm (0: off)")
      ->capture_default_str()
      ->check(real_in(kGradClipRange));
}

// Checkpoints, stops, metrics and evaluation.
void add_checkpoint_flags(CLI::App* sub, TrainFlags* f) {
  TrainOptions& t = f->train;
  sub->add_option("--checkpoint", t.checkpoint_dir, "checkpoint directory");
  sub->add_option("--checkpoint-every", t.checkpoint_every, "steps between checkpoints (0: at the end only)")
      ->check(int_in({0, 1 << 30}));
  sub->add_flag("--resume", t.resume, "continue from the checkpoint in --checkpoint if there is one");
  sub->add_flag("--overwrite-checkpoint", t.overwrite_checkpoint,
                "start from step 1 even though --checkpoint holds a checkpoint, replacing it");
  sub->add_option("--stop-at", t.stop_at, "stop after this step, as a preemption would (checkpointed)")
      ->check(int_in(kSteps));
  sub->add_option("--metrics", t.metrics, "append one JSON object per step to this file");
  sub->add_option("--eval-every", t.eval_every, "steps between validation losses (0: none)")
      ->check(int_in({0, 1 << 30}));
  sub->add_option("--eval-sequences", t.eval_sequences, "validation sequences per evaluation (text)")
      ->capture_default_str()
      ->check(int_in({1, 1 << 20}));
  sub->add_option("--eval-images", t.eval_images,
                  "test images per evaluation (images; 0: the whole test set), or test questions (VQA; 0: one per "
                  "four test images)")
      ->capture_default_str()
      ->check(int_in({0, 1 << 30}));
}

// How the ranks run and what the run reports: MFU's peak, seed, ranks,
// threads, trace, tokenizer, initial weights, fault injection.
void add_run_flags(CLI::App* sub, TrainFlags* f) {
  TrainOptions& t = f->train;
  sub->add_option("--peak-tflops", f->peak_tflops,
                  "peak TFLOP/s of one rank, for the run summary's MFU (default on the cpu backend: this process's "
                  "cores at the local-cpu preset's rate; on cuda: none)")
      ->check(real_in({0, 1e7, true}));
  sub->add_option("--seed", t.seed, "seed of initialisation, data order and dropout")
      ->capture_default_str()
      ->check(uint64_up_to(std::numeric_limits<std::uint64_t>::max()));
  sub->add_option("--ranks", f->ranks, "threads (one process) or mpi (under mpirun/srun)")->capture_default_str();
  sub->add_option("--comm-timeout", f->comm_timeout_s, "seconds a rank waits for its peers before failing")
      ->capture_default_str()
      ->check(real_in({1e-3, 7 * 24 * 3600.0}));
  sub->add_option("--trace", f->trace,
                  "write a Chrome trace of the run (one process per rank, one track per stream); "
                  "under MPI rank 0 gathers every rank's events into this one file, on its clock");
  sub->add_option("--threads", f->threads,
                  "cpu backend: threads per rank (default: this process's cores divided among its "
                  "rank threads; results do not depend on it)")
      ->check(int_in({0, max_cpu_threads_per_rank()}));
  sub->add_option("--tokenizer", f->tokenizer,
                  "the SentencePiece model (PREFIX.model of `meshtrain tokenize train`) that made the --data tokens: "
                  "its pieces must fit the model's vocab; with --checkpoint it is copied into the checkpoint, and "
                  "--resume checks it is the same file");
  sub->add_option("--init-from", t.init_from,
                  "start from the weights of a safetensors file with Hugging Face names (meshtrain export; GPT-2, "
                  "Llama and Mixtral layouts), checked against the config.json beside it; a resumed checkpoint "
                  "takes precedence");
  sub->add_flag("--quiet", f->quiet, "no progress lines");
  sub->add_option("--fault-inject", f->faults,
                  "RANK:slow:STEP[:FACTOR], RANK:hang:STEP, RANK:exit:STEP, RANK:signal:STEP:SIG or RANK:throw:STEP: "
                  "make a rank slow down, stop answering, die (SIGKILL under MPI), crash by SIG (SEGV, BUS, FPE, ILL, "
                  "ABRT, KILL) or throw at a step (tests of straggler reports, --comm-timeout, crash reports and "
                  "checkpoints); repeatable");
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  CLI::App* sub = app.add_subcommand(
      "train", "train a model with a parallel plan: a language model on a file (byte tokens), a vision model on images");
  add_plan_flags(*sub, f->plan, "tiny");
  sub->add_option("--data", f->train.data,
                  "a language model: an llm.c token file (uint16 or uint32 ids after a 1024-byte header), the "
                  "PREFIX of a Megatron .bin/.idx pair, or any other file, whose bytes are the tokens; a vision "
                  "model: fashion-mnist or a directory of IDX image files (train-* and t10k-*); a VQA model: the "
                  "same, as questions about 2x2 grids of its images")
      ->required();
  sub->add_option("--backend", f->backend, "cpu, or cuda (one rank per process; a build with CUDA)")
      ->capture_default_str();
  add_optimizer_flags(sub, f.get());
  add_checkpoint_flags(sub, f.get());
  add_run_flags(sub, f.get());
  return {sub, [f] { return run_train(*f); }};
}

}  // namespace meshtrain
