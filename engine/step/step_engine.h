// StepEngine: one rank's part of one segment's training iteration
// (engine/plan/segment_plan.h; a uniform plan is a plan of one segment),
// under any hybrid plan. TrainingEngine (training_engine.h) runs the
// segments' StepEngines as one iteration.
//
// It owns the rank's model chunk(s) (vpp of them, virtual stages c·pp + stage,
// each with Megatron tensor parallelism inside), gradient buckets and AdamW
// state, and turns one iteration's micro-batches into the pipeline schedule's
// forward and backward work (engine/parallel/pipeline_executor.h), the
// data-parallel gradient reduction in buckets overlapped with backward or
// after it (Plan::grad_bucket_mb and grad_sync; gradient_buckets.h), ZeRO
// sharding of the optimizer state (sharded_optimizer.h), of the gradients (stage 2: a layer's gradient lives
// only while backward works on it) and of the parameters (stage 3, gathered
// layer by layer with prefetch: parameter_gather.h), the loss and gradient
// norm reduced over the segment, and the update, all as backend ops.
//
// Every rank of the segment's mesh constructs a StepEngine and calls each
// method the same number of times in the same order: they are collective.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "backends/backend.h"
#include "core/bounded.h"
#include "engine/parallel/pipeline_executor.h"
#include "engine/parallel/sharded_optimizer.h"
#include "engine/plan/mesh.h"
#include "engine/plan/plan.h"
#include "models/model_chunk.h"
#include "models/model_io.h"

namespace meshtrain {

struct OptimizerOptions {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;
  DecayedParams decayed = DecayedParams::linear;  // which parameters weight_decay applies to
  float max_grad_norm = 1.0f; // <= 0: no clipping
};

struct StepOptions {
  OptimizerOptions optimizer;
  float dropout = 0.f;
  std::uint64_t seed = 1234;  // initialisation and dropout
  // How a backend without data (sim) spreads tokens over experts
  // (models/moe_routing.h); null: the routers decide on the data.
  std::shared_ptr<const MoeRouting> moe_routing;
  // false: leave parameter values as the backend allocated them. The sim
  // backend holds no data, and the host-side init loop over every element
  // would dominate simulating a 100B+ model.
  bool initialize_parameters = true;
  // Precision fp8 trained as exact emulation (engine/step/fp8_training.h): the
  // linears' GEMM operands rounded to FP8 with delayed scaling, everything
  // else in fp32 (the cpu backend's only precision). false: a plan of
  // precision fp8 keeps bf16 activations and casts only its GEMM operands
  // (the sim backend, which costs the casts and times the GEMMs at FP8).
  bool emulate_fp8 = false;
};

// Mixed precision: 16-bit working weights and activations (fp32 masters, gradients and AdamW state).
DType activation_dtype(Precision p);
// The same for an engine run with `o`: fp32 under the FP8 emulation.
DType activation_dtype(Precision p, const StepOptions& o);

// The ranges of StepOptions' numbers, which the flags that set them share.
inline constexpr RealRange kDropoutRange{0, 1, false, true};
inline constexpr RealRange kWeightDecayRange{0, 1e3};
inline constexpr RealRange kGradClipRange{0, 1e30};  // 0: no clipping
inline constexpr RealRange kAdamBetaRange{0, 1, false, true};  // [0, 1)
inline constexpr RealRange kAdamEpsRange{0, 1, true, false};   // (0, 1]

// An Error naming the option unless `o` is usable: each number finite and in its range.
Status check_step_options(const StepOptions& o);

// One micro-batch on the host. A language model reads ids and next-token
// targets (B·T each); a vision model reads pixels (B, H, W, channels),
// normalised, and one class label per image in targets (B), with seq the
// model's tokens per image (ModelSpec::seq_len); a VQA model reads pixels,
// each sample's question in ids (B·Q, left-padded) and its answer word in
// targets (B), with seq its decoder's tokens (ModelSpec::seq_len).
struct HostBatch {
  std::vector<std::int32_t> ids, targets;
  std::vector<float> pixels;
  // Blank images, not stored (example_batch): a plan made of segments takes
  // the whole global batch, gigabytes of pixels at 1024 GPUs, of which each
  // rank writes only its micro-batches' zeros.
  bool blank_pixels = false;
  int batch = 0, seq = 0;
};

// Samples [begin, end) of `all`: its ids, targets and pixels, each cut per sample.
HostBatch sample_range(const HostBatch& all, std::int64_t begin, std::int64_t end);

// A micro-batch of `micro_batch` samples of synthetic data shaped for model
// `m` (token ids, or blank images and labels), for timing and simulation.
HostBatch example_batch(const ModelSpec& m, int micro_batch, int seq);

// A mixture-of-experts model's figures of one step (models/moe_layer.h), over
// the global batch.
struct MoeStepStats {
  double aux_loss = 0;  // the load-balancing terms added to the objective (coefficient included), all MoE layers
  double z_loss = 0;    // the router z-loss terms added (coefficient included)
  double balance = 0;   // E·Σ_e f_e·P_e per MoE layer and micro-batch, mean (1: balanced routing)
  double router_z = 0;  // mean over MoE layers and micro-batches of mean_n lse_n²
  // Assignments per expert (before drops) over the step, by MoE layer; and
  // max / mean of them, the worst layer's and the mean over layers.
  std::vector<std::vector<double>> tokens_per_expert;
  double load_max_over_mean = 0, load_mean_max_over_mean = 0;
  double dropped_fraction = 0;  // share of assignments the capacity dropped
};

struct StepResult {
  double loss = 0;       // mean loss over the global batch's targets (tokens or images)
  double grad_norm = 0;  // global L2 norm before clipping
  MoeStepStats moe;      // a model with experts only
};

// An error naming the step when the loss or the gradient norm is not finite
// (the update must not run).
Status check_finite(const StepResult& r, std::int64_t step);

struct Evaluation {
  double loss = 0;      // mean loss over every target of the batches
  double accuracy = 0;  // share of targets whose logit is the largest (top-1)
};

// How the engine of one segment of a plan (engine/plan/segment_plan.h) meets its
// neighbours: where its first virtual stage's input comes from when it does
// not start the model, where its last virtual stage's output goes when it
// does not end it, and the gradients the other way, by micro-batch of this
// rank's replica. The engine calls input/output_grad when it needs them and
// output/input_grad when they are ready.
class SegmentBoundary {
 public:
  virtual ~SegmentBoundary() = default;
  virtual Tensor input(int microbatch, const Shape& shape, DType dtype) = 0;
  virtual void output(int microbatch, const Tensor& y) = 0;
  virtual Tensor output_grad(int microbatch, const Shape& shape, DType dtype) = 0;
  virtual void input_grad(int microbatch, const Tensor& dx) = 0;
};

class StepEngine {
 public:
  StepEngine(Backend& b, const ModelSpec& m, const Plan& p, const Mesh& mesh, StepOptions options);
  ~StepEngine();
  // The chunks' hooks hold `this`.
  StepEngine(const StepEngine&) = delete;
  StepEngine& operator=(const StepEngine&) = delete;

  // Whether this engine can run plan `p` with options `o` (on top of
  // validate_plan): an Error names what it cannot do. A StepEngine built for
  // such a plan returns the same Error from every method.
  static Status supports(const Plan& p, const StepOptions& o = {});

  // The full (unsharded) parameters and AdamW moments by name ("params/<name>",
  // "adam_m/<name>", "adam_v/<name>"), for checkpoints and comparisons.
  // Gathered over tensor-parallel shards, pipeline stages and ZeRO shards, so
  // the content does not depend on the plan; every rank of the segment
  // returns all of the segment's.
  Result<std::map<std::string, std::vector<float>>> export_state();
  // Loads what export_state produced (under any plan); every name must be
  // present with its full size. Each rank keeps its own shards.
  Status import_state(const std::map<std::string, std::vector<float>>& state);
  // This rank's own state that no other rank holds and that depends on the
  // plan: 1bit compression's error feedback (GradientBuckets::export_errors),
  // chunk by chunk; empty when there is none. Not collective.
  Result<std::vector<float>> export_rank_state();
  Status import_rank_state(std::span<const float> state);  // what export_rank_state returned
  std::int64_t rank_state_numel() const;

  // ---- One iteration, in the order TrainingEngine (training_engine.h) calls
  // the pieces on every segment: begin_step, run, reduce_statistics, the
  // host's read of step_stats on update_stream, then finish_update. ----
  //
  // A rank receives its data-parallel replica's share of the segment's
  // global batch: plan.microbatches() micro-batches of plan.micro_batch
  // samples, replica d (Coord::dp) getting global micro-batches [d·m, (d+1)·m).
  // Every rank of one replica (its tensor- and pipeline-parallel peers)
  // receives the same ones. The objective is the mean loss over the global
  // batch's targets.
  //
  // Plan::overlap_update: the reductions' tail, the gradient norm, the loss's
  // reduction and the updates run on the data-parallel stream, and the next
  // step's forward of a layer waits only for its buckets' updates. The
  // parameters' bits are those of the plan without it (each bucket's update
  // is the same op on the same data). Without clipping (max_grad_norm 0) a
  // bucket updates as soon as its last reduction is issued, during backward,
  // before the host has seen the loss. With clipping every update waits for
  // the global norm and is issued after the host's check, as without the
  // option; the updates (and ZeRO 1/2 all-gathers) then run in forward order,
  // under the next forward. On a real device the host's read of the loss and
  // norm still waits for the last reduction before it issues the next step:
  // the device-side dependencies are per layer, the host's are per step.
  enum class Phase { all, forward, backward };
  // Null: the segment is the whole model. Must outlive the engine's use.
  void set_boundary(SegmentBoundary* boundary) { boundary_ = boundary; }
  // Learning rate `lr` at 1-based optimizer step `step`.
  Status begin_step(const std::vector<HostBatch>& microbatches, std::int64_t step, float lr);
  // The schedule's actions, or those before (forward) or from (backward) its
  // first backward: a GPipe schedule's forward and backward halves.
  void run(Phase phase);
  // Gradients complete (the tied embedding's two copies summed, every bucket
  // reduced), then step_stats reduced over the segment's ranks and, under
  // precision fp8 with delayed scaling, step t's amax folded into step t+1's
  // scales.
  Status reduce_statistics(std::int64_t step);
  // (2) [Σ of the step's losses (zero unless the segment holds the head),
  // Σ g² over the segment's parameters, each element once], the same on
  // every rank of the segment after reduce_statistics.
  const Tensor& step_stats() const { return step_stats_; }
  // Where the statistics and the update are issued: the data-parallel stream
  // under Plan::overlap_update, else the compute stream.
  Stream update_stream() const { return plan_.overlap_update ? comm_ : compute_; }
  // The routed experts' statistics of the step, summed over the segment's
  // replicas and stages (a model with experts). BLOCKS.
  Result<MoeStepStats> moe_statistics();
  // AdamW on every parameter, gradients scaled by `coef` (clipping; undefined: none).
  void finish_update(const Tensor& coef);
  // Forward only over `batches`: begin_evaluation, run_evaluation, then
  // evaluation_stats: (3) [Σ loss, targets, correct] reduced over the
  // segment's ranks (zeros unless it holds the head).
  Status begin_evaluation(const std::vector<HostBatch>& batches);
  void run_evaluation();
  const Tensor& evaluation_stats();

 private:
  struct Chunk;  // engine/step/step_chunk.h
  // The constructor's steps. supports() and FP8 training's checks, then this rank's pipeline executor.
  Status check_and_build_pipeline();
  // What every chunk of this rank shares: recompute, dropout, ZeRO's storage, the value dtype,
  // sequence parallelism and the expert and context meshes.
  ChunkOptions chunk_options() const;
  // Local chunk c: its layers and parameters (initialised), FP8 scaling, gradient buckets, ZeRO-3
  // gather, layer hooks and optimizer.
  std::unique_ptr<Chunk> build_chunk(int c, const TensorParallel& tp, const ChunkOptions& shared);
  void add_buckets(Chunk& chunk, int c);
  // The hooks around each layer's passes: bucket reductions, ZeRO-3 gathers, overlapped updates.
  void set_layer_hooks(Chunk& chunk);
  // The chunk's AdamW, and under offload or overlap_update the bucket callbacks that start its work early.
  void add_optimizer(Chunk& chunk);
  // Fills next_pass_ from this rank's schedule.
  void map_next_passes();
  // Precision fp8 trained as exact emulation (StepOptions::emulate_fp8).
  bool emulates_fp8() const { return plan_.precision == Precision::fp8 && options_.emulate_fp8; }
  MicroBatch upload(const HostBatch& h, std::uint64_t dropout_seed);
  // Checks a micro-batch against the model: its size, and under sequence
  // parallelism that tp divides the rows at every block.
  Status check_batch(const HostBatch& h) const;
  // Under sequence parallelism, tp must divide the rows of every layer.
  Status check_sequence_split(const HostBatch& h) const;
  // What chunk c's neighbours send it for `mbs[j]` (PipelineCompute::boundary).
  std::function<Shape(int, int, bool)> boundaries(const std::vector<MicroBatch>& mbs) const;
  bool counts_in_norm(const Chunk& c, const ParamSlot& slot) const;
  Status all_reduce_tied_embedding();
  // Adds the expert parameters' squared gradient norm to grad_sumsq_ (each expert shard once).
  void add_expert_sumsq();
  // AdamW's hyper-parameters at `step` (1-bit Adam's frozen variance included).
  AdamWOp adamw_op(float lr, std::int64_t step) const;
  WeightDecay weight_decay() const { return {options_.optimizer.weight_decay, options_.optimizer.decayed}; }
  // Plan::overlap_update: bucket i of chunk c updated on the data-parallel
  // stream with this step's update_op_ and clip coefficient `coef`; the
  // remaining updates (clipping) and ZeRO 1/2 all-gathers at the step's end;
  // the compute stream's wait, before layer `layer`'s forward, for the
  // updates of its buckets; and (settle) for every update, before anything
  // else reads the parameters or moments.
  void update_bucket(Chunk& c, std::size_t i, const Tensor& coef);
  void finish_overlapped_update(const Tensor& coef);
  void wait_for_update(Chunk& c, int layer);
  void settle();
  // ZeRO 3 (Plan::prefetch_across_chunks): tells chunk c's parameter gather
  // which pass follows its forward (backward = false) or backward of
  // micro-batch j in this rank's action order (next_pass_), or none.
  void name_next_pass(int c, int j, bool backward, bool training);
  // The ranks holding this rank's parameters: the data-parallel group, or
  // under context parallelism the data and context ranks together.
  const Group& replicas() const;
  // reduce_statistics' steps.
  Status finish_gradients();
  void reduce_grad_norm();
  void reduce_loss();

  Backend& b_;
  ModelSpec m_;
  // What the model reads and reports (its per-sequence fields are those at the model's seq_len;
  // per-batch ones come from model_io at the batch's own length).
  ModelIo io_;
  Plan plan_;
  Mesh mesh_;
  StepOptions options_;
  Coord coord_;
  Stream compute_, comm_;
  std::optional<Stream> expert_;  // Plan::moe_a2a_overlap: the MoE layers' token all-to-alls
  OffloadStreams offload_;  // Plan::offload: the offloaded optimizer step's streams
  std::vector<std::unique_ptr<Chunk>> chunks_;  // local chunk c: virtual stage c·pp + stage
  std::unique_ptr<PipelineExecutor> pipeline_;
  // (2) [loss_total_, grad_sumsq_]: step() reads both with one wait for the device.
  Tensor step_stats_;
  Tensor loss_total_;  // (1) view of step_stats_: Σ token losses of the iteration on this rank
  Tensor grad_sumsq_;  // (1) view of step_stats_: Σ g² (reduce_grad_norm)
  Tensor eval_stats_;  // (3) of the evaluation in progress
  int moe_layers_ = 0;  // of the whole model
  std::optional<Error> setup_error_;
  SegmentBoundary* boundary_ = nullptr;
  // The iteration (or evaluation) in progress.
  std::vector<MicroBatch> mbs_;
  double loss_terms_ = 0;  // targets (tokens or images) of the global batch
  float loss_scale_ = 0;   // 1 / loss_terms_
  AdamWOp update_op_{};    // the step's AdamW hyper-parameters
  // (backward, chunk, micro-batch) of each forward and backward in this rank's
  // schedule -> (chunk, backward) of the next one; the last has none.
  std::map<std::tuple<bool, int, int>, std::pair<int, bool>> next_pass_;
  // What PipelineExecutor runs for mbs_: training (forward and backward) or evaluation (forward only).
  PipelineCompute compute(bool training);
  // Its passes of chunk c on micro-batch j, as phases (core/phased.h): PipelineCompute runs them
  // whole, or one forward's interleaved with one backward's under EP all-to-all overlap.
  Phased<Tensor> forward_pass(int c, int j, Tensor in, bool training);
  Phased<Tensor> backward_pass(int c, int j, Tensor dout);
  DType value_dtype() const { return activation_dtype(plan_.precision, options_); }
  // Each chunk's FP8 scaling state (precision fp8), else none.
  std::vector<Fp8Scaling*> fp8_chunks() const;
};

}  // namespace meshtrain
