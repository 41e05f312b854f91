// `meshtrain train`: real training on the cpu backend (ranks as threads of
// this process by default, or as MPI processes under mpirun/srun) or on the
// cuda backend (one rank per process: alone, or under mpirun/srun). With
// --trace every rank's backend is wrapped in a TracingBackend.
#include <memory>
#include <optional>

#include "backends/comm/launch.h"
#include "backends/comm/mpi_environment.h"
#include "backends/cpu/comm/in_process.h"
#include "backends/cpu/comm/mpi_communicator.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/threads.h"
#include "backends/cuda/cuda_factory.h"
#include "core/input_file.h"
#include "core/names.h"
#include "engine/cli/bounded_flags.h"
#include "engine/cli/commands.h"
#include "engine/cli/plan_flags.h"
#include "engine/stop_request.h"
#include "engine/tokenizer.h"
#include "engine/tracing/tracing_backend.h"
#include "engine/trainer.h"

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
  std::vector<std::string> faults;  // --fault-inject specs (engine/fault_injection.h)
  std::string tokenizer;  // --tokenizer: the SentencePiece model the --data tokens were made with
};

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

// The cpu backend of a rank that shares this process's cores with
// `ranks_sharing` ranks (threads of this process, or unbound MPI processes).
CpuBackendOptions cpu_options(const TrainFlags& f, int ranks_sharing) {
  return {cpu::rank_threads(f.threads, ranks_sharing)};
}

// The precisions a backend trains in: the cpu backend computes in fp32 only;
// the cuda backend also in bf16 (fp32 master weights and optimizer state).
// fp16 would need loss scaling, which the trainer does not do.
Status check_precision(const std::string& backend, Precision p) {
  if (backend == "cpu" && p != Precision::fp32)
    return make_error("the cpu backend trains in fp32, got --precision {}; use --precision fp32",
                      precision_name(p));
  if (p == Precision::fp16)
    return make_error("--precision fp16 needs loss scaling, which the trainer does not do; use "
                      "--precision bf16 or fp32");
  return ok_status();
}

// The trace collected so far goes to `path` whatever `status` says (a trace
// of a failed run shows where it failed); the run's own error comes first.
Status finish_trace(Status status, const std::optional<TraceRecorder>& recorder,
                    const std::string& path) {
  if (!recorder) return status;
  Status written = recorder->write(path);
  return status.ok() ? written : status;
}

Status run_train(TrainFlags f) {
  if (f.backend != "cpu" && f.backend != "cuda")
    return Error(unknown_name_message("training backend", f.backend, {"cpu", "cuda"}) +
                 "; the sim backend runs under `meshtrain simulate`");
  const bool cuda = f.backend == "cuda";
  if (f.ranks != "threads" && f.ranks != "mpi")
    return Error(unknown_name_message("--ranks", f.ranks, {"threads", "mpi"}));
  // fp32 is the cpu backend's default (and only choice); cuda keeps the plan's (bf16).
  if (!cuda && !f.plan.overrides.precision) f.plan.overrides.precision = "fp32";
  MT_ASSIGN(auto launch, detect_launch());
  const bool mpi = f.ranks == "mpi" || launch.has_value();
  MT_ASSIGN(ModelAndPlan mp, resolve_model_and_plan(f.plan, mpi && launch ? launch->world_size : 0));
  MT_TRY(check_precision(f.backend, mp.plan.precision));
  if (cuda && !mpi && mp.plan.world_size() > 1)
    return make_error("the cuda backend runs one rank per process, and this plan has {} ranks; launch "
                      "them with `mpirun -np {} meshtrain train ...` or srun",
                      mp.plan.world_size(), mp.plan.world_size());
  install_stop_handlers();
  f.train.progress = !f.quiet;
  f.train.step.seed = f.train.seed;
  const auto timeout = std::chrono::milliseconds(static_cast<long long>(f.comm_timeout_s * 1000));
  const CommOptions comm{timeout};
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
  std::optional<TraceRecorder> recorder;
  if (!f.trace.empty()) recorder.emplace();
  // Trains one rank on `b`, through a TracingBackend when tracing; the
  // wrapper hands its events to the recorder when it goes out of scope here.
  auto train_on = [&](Backend& b) -> Status {
    if (!recorder) return train_rank(b, mp.model, mp.plan, f.train);
    TracingBackend traced(b, *recorder);
    return train_rank(traced, mp.model, mp.plan, f.train);
  };

  if (mpi) {
    MT_ASSIGN(auto env, MpiEnvironment::init(nullptr, nullptr));
    if (env->world_size() != mp.plan.world_size())
      return make_error("mpirun started {} processes, the plan needs tp·pp·dp·cp = {}", env->world_size(),
                        mp.plan.world_size());
    std::optional<CheckpointLock> lock;  // rank 0 writes the checkpoints and holds their directory
    if (env->rank() == 0) {
      MT_TRY(check_train_options(f.train, mp.model, mp.plan, cuda ? 0 : 1));
      MT_ASSIGN(const int tokenizer_pieces,
                f.tokenizer.empty() ? Result<int>(0) : tokenizer_vocab(f.tokenizer, mp.model));
      MT_ASSIGN(lock, claim_checkpoint(f.train));
      if (lock) {
        MT_ASSIGN(f.train.tokenizer, run_tokenizer(f.train, f.tokenizer, tokenizer_pieces));
      }
    }
    // Each process writes its own rank's trace (trace_recorder.h, rank_trace_path).
    const std::string trace_path = rank_trace_path(f.trace, env->rank());
    // A failed rank must not leave its peers waiting: stop the whole job.
    if (recorder)
      if (Status s = TraceRecorder::probe(trace_path); !s.ok()) abort_job(s.error());
    std::unique_ptr<MpiCommunicator> communicator;
    std::unique_ptr<Backend> backend;
    if (cuda) {
      auto made = make_cuda_backend({.device = -1, .use_mpi = true, .comm_timeout = timeout});
      if (!made.ok()) abort_job(made.error());
      backend = std::move(made).value();
    } else {
      auto made = MpiCommunicator::create(comm);
      if (!made.ok()) abort_job(made.error());
      communicator = std::move(made).value();
      backend = std::make_unique<CpuBackend>(*communicator, cpu_options(f, cpu::mpi_ranks_sharing_cores()));
    }
    Status status = finish_trace(train_on(*backend), recorder, trace_path);
    // A stop that every rank agreed on ends each rank alike; any other failure stops the job.
    if (!status.ok() && stop_signal() == 0) abort_job(status.error());
    return status;
  }
  MT_TRY(check_train_options(f.train, mp.model, mp.plan, cuda ? 0 : mp.plan.world_size()));
  MT_ASSIGN(const int tokenizer_pieces, f.tokenizer.empty() ? Result<int>(0) : tokenizer_vocab(f.tokenizer, mp.model));
  MT_ASSIGN(const std::optional<CheckpointLock> lock, claim_checkpoint(f.train));
  if (lock) {
    MT_ASSIGN(f.train.tokenizer, run_tokenizer(f.train, f.tokenizer, tokenizer_pieces));
  }
  if (recorder) MT_TRY(TraceRecorder::probe(f.trace));
  if (mp.plan.world_size() == 1) {
    std::unique_ptr<Backend> backend;
    if (cuda) {
      MT_ASSIGN(backend, make_cuda_backend({.device = -1, .use_mpi = false, .comm_timeout = timeout}));
    } else {
      backend = std::make_unique<CpuBackend>(cpu_options(f, 1));
    }
    return finish_trace(train_on(*backend), recorder, f.trace);
  }
  Status status = run_ranks(
      mp.plan.world_size(),
      [&](int rank, Communicator& c) {
        CpuBackend backend(c, cpu_options(f, mp.plan.world_size()));
        auto status = train_on(backend);
        if (!status.ok()) status.context(fmt::format("rank {}", rank));
        return status;
      },
      comm);
  status = f.train.rank_losses->summarize(std::move(status), f.train.steps);
  return finish_trace(std::move(status), recorder, f.trace);
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  CLI::App* sub = app.add_subcommand(
      "train", "train a model with a parallel plan: a language model on a file (byte tokens), a vision model on images");
  add_plan_flags(*sub, f->plan, "tiny");
  TrainOptions& t = f->train;
  sub->add_option("--data", t.data,
                  "a language model: an llm.c token file (uint16 or uint32 ids after a 1024-byte header), the "
                  "PREFIX of a Megatron .bin/.idx pair, or any other file, whose bytes are the tokens; a vision "
                  "model: fashion-mnist or a directory of IDX image files (train-* and t10k-*); a VQA model: the "
                  "same, as questions about 2x2 grids of its images")
      ->required();
  sub->add_option("--backend", f->backend, "cpu, or cuda (one rank per process; a build with CUDA)")
      ->capture_default_str();
  constexpr IntRange kSteps{1, 1 << 30};
  const RealRange kRate{0, std::numeric_limits<double>::max(), true};
  sub->add_option("--steps", t.steps, "optimizer steps")->capture_default_str()->check(int_in(kSteps));
  sub->add_option("--lr", t.lr, "peak learning rate")->capture_default_str()->check(real_in(kRate));
  sub->add_option("--min-lr", t.min_lr, "learning rate at the end of the cosine decay")
      ->capture_default_str()
      ->check(real_in({0, std::numeric_limits<double>::max()}));
  sub->add_option("--warmup", t.warmup, "linear warm-up steps (default 10, at most --steps)")
      ->check(int_in({0, 1 << 30}));
  sub->add_option("--seed", t.seed, "seed of initialisation, data order and dropout")
      ->capture_default_str()
      ->check(uint64_up_to(std::numeric_limits<std::uint64_t>::max()));
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
  sub->add_option("--dropout", t.step.dropout, "dropout probability")
      ->capture_default_str()
      ->check(real_in(kDropoutRange));
  sub->add_option("--weight-decay", t.step.optimizer.weight_decay, "AdamW weight decay")
      ->capture_default_str()
      ->check(real_in(kWeightDecayRange));
  sub->add_option("--grad-clip", t.step.optimizer.max_grad_norm, "clip gradients to this global norm (0: off)")
      ->capture_default_str()
      ->check(real_in(kGradClipRange));
  sub->add_option("--ranks", f->ranks, "threads (one process) or mpi (under mpirun/srun)")->capture_default_str();
  sub->add_option("--comm-timeout", f->comm_timeout_s, "seconds a rank waits for its peers before failing")
      ->capture_default_str()
      ->check(real_in({1e-3, 7 * 24 * 3600.0}));
  sub->add_option("--trace", f->trace,
                  "write a Chrome trace of the run (one process per rank, one track per stream); "
                  "under MPI each rank writes FILE.rank<N>.json");
  sub->add_option("--threads", f->threads,
                  "cpu backend: threads per rank (default: this process's cores divided among its "
                  "rank threads; results do not depend on it)")
      ->check(int_in({0, cpu::kMaxRankThreads}));
  sub->add_option("--tokenizer", f->tokenizer,
                  "the SentencePiece model (PREFIX.model of `meshtrain tokenize train`) that made the --data tokens: "
                  "its pieces must fit the model's vocab; with --checkpoint it is copied into the checkpoint, and "
                  "--resume checks it is the same file");
  sub->add_flag("--quiet", f->quiet, "no progress lines");
  sub->add_option("--fault-inject", f->faults,
                  "RANK:slow:STEP[:FACTOR], RANK:hang:STEP or RANK:exit:STEP: make a rank slow down, stop answering or "
                  "die at a step (tests of straggler reports, --comm-timeout and checkpoints); repeatable");
  return {sub, [f] { return run_train(*f); }};
}

}  // namespace meshtrain
