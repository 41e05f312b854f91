// `meshtrain calibrate`: measures this machine's kernels and communicators
// through the backend interface and writes the simulator's calibration file
// (simulator/calibration.h).
//
// It measures at one precision (--precision; default as `meshtrain train`
// on the backend: fp32 on cpu, bf16 on cuda), recorded in the file: the
// workloads' shapes carry the dtypes their step gives each tensor at that
// precision (bf16 GEMM inputs, fp32 weight-gradient accumulation, fp32
// optimizer state), the grids its activation dtype.
//
// What it measures, and how (the timing rules are in measure.h):
//  * GEMM: the (m, n, k, transposes) each --workload issues under tp 1 and 2
//    (every linear layer forward, its input and weight gradients, the tied
//    head), plus a log-spaced cube grid.
//  * grouped GEMM (MoE experts over their tokens), forward and weight
//    gradients, the MoE workloads' (uniform routing) and a grid of rows per
//    expert (grouped_grid.h), each
//    beside the plain GEMM of the same total rows.
//  * attention forward and backward: the workloads' (batch, heads/tp, seq,
//    head dim) plus a small grid.
//  * memory-bound and host ops, each kind on its own (every one of the op
//    table's, backends/op_table.h: measured_ops()), over a
//    log-spaced grid of sizes plus the workloads' (tokens, width) shapes;
//    copy also fills the by-bytes "memory" table.
//  * each of those at every --sharing level k: k rank threads, each with its
//    own backend of cores/k threads (as `meshtrain train` shares the cores
//    out among its rank threads; --threads N as train's --threads N), run the
//    same op at once (ranks outnumbering the cores time-share them and their
//    memory bandwidth).
//  * communication, in process (ranks as threads): every collective and
//    send/recv for 2..--max-ranks members over a log-spaced range of sizes,
//    and the link latency and bandwidth of send/recv.
//  * MPI: under mpirun every process takes part and the same collectives are
//    measured over the "mpi" communicator (transport "mpi"); rank 0 measures
//    everything else first while the others wait, and writes the file. A
//    plain run records in machine.notes that MPI was not measured.
// --backend cuda runs the same functions on make_cuda_backend's backend
// (kernels on rank 0's GPU; collectives of all ranks under mpirun); a build
// without CUDA says so.
#include <sys/utsname.h>

#include <algorithm>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <cblas.h>
#include <mpi.h>
#include <oneapi/tbb/version.h>
#include <optional>

#include "backends/comm/launch.h"
#include "backends/op_table.h"
#include "backends/comm/mpi_environment.h"
#include "core/bounded.h"
#include "core/host_memory.h"
#include "core/input_file.h"
#include "core/names.h"
#include "engine/calibrate/grouped_grid.h"
#include "engine/calibrate/measure.h"
#include "engine/calibrate/op_profile.h"
#include "engine/calibrate/workload.h"
#include "engine/calibrate/workload_shapes.h"
#include "engine/cli/backend_registry.h"
#include "engine/cli/bounded_flags.h"
#include "engine/cli/commands.h"
#include "models/model_spec.h"
#include "models/parameters.h"
#include "simulator/calibration.h"

namespace meshtrain {
namespace {

using calibrate::AttentionShape;
using calibrate::GemmShape;
using calibrate::GroupedGemmShape;
using calibrate::OpShape;

struct CalibrateFlags {
  std::string backend = "cpu";
  std::string precision;  // empty: train's default on the backend (precision_for_backend)
  std::string out;
  bool quick = false;
  bool no_grid = false;              // only the workloads' shapes
  std::string statistic = "median";  // or "mean" (Timing::mean)
  std::vector<std::string> workloads = {"tiny:8:64"};
  std::vector<int> sharing;  // default {1, 2}
  int max_ranks = 0;         // default max(2, cores)
  std::string profile, calibration;  // --profile mode (op_profile.h)
  int profile_steps = 5, profile_ranks = 1;
  double profile_budget_s = 10;
  int threads = 0;  // per rank thread, as train's --threads; 0: the cores shared out among the ranks
};

// Host bytes of the largest shape measured (its fp32 operands and result at
// once): refused with the figure before anything is allocated.
Status check_shapes_fit(const std::set<GemmShape>& gemm, const std::set<AttentionShape>& attention,
                        const std::set<OpShape>& ops) {
  double bytes = 0;
  for (const GemmShape& g : gemm)
    bytes = std::max(bytes, 4.0 * (static_cast<double>(g.m) * g.k + static_cast<double>(g.k) * g.n +
                                   static_cast<double>(g.m) * g.n));
  // qkv, out and their gradients (B, T, 3H, D) and (B, T, H, D), twice over for backward.
  for (const AttentionShape& s : attention)
    bytes = std::max(bytes, 4.0 * 8 * static_cast<double>(s.batch) * s.heads * s.seq * s.head_dim);
  // An op reads and writes a few tensors of its shape.
  for (const OpShape& o : ops) bytes = std::max(bytes, 4.0 * 4 * static_cast<double>(o.rows) * o.cols);
  return check_host_memory(bytes, "measuring the largest --workload shape", "use a smaller micro-batch, "
                           "sequence length or model in --workload");
}

// The precision a calibration measures at: --precision, or what `meshtrain
// train` runs on that backend when not told (the cpu backend computes in fp32
// only; the cuda backend trains in the plan's default, bf16). The cpu backend
// has no bf16 compute, so a bf16 calibration of it would time nothing a run does.
Result<Precision> precision_for_backend(const std::string& backend, const std::string& flag) {
  if (flag.empty()) return backend == "cuda" ? Precision::bf16 : Precision::fp32;
  if (flag != "fp32" && flag != "bf16") return Error(unknown_name_message("--precision", flag, {"fp32", "bf16"}));
  const Precision p = flag == "bf16" ? Precision::bf16 : Precision::fp32;
  if (backend == "cpu" && p != Precision::fp32)
    return make_error("--precision {}: the cpu backend computes in fp32 only (as `meshtrain train` does on it); "
                      "calibrate it with --precision fp32, or a GPU with --backend cuda --precision {}",
                      flag, flag);
  return p;
}

// The log-spaced grids every calibration has, with activations at `dtype`.
void grid_shapes(bool quick, DType dtype, std::set<GemmShape>& gemm, std::set<AttentionShape>& attention,
                 std::set<OpShape>& ops) {
  const std::vector<std::int64_t> cube =
      quick ? std::vector<std::int64_t>{32, 128, 512} : std::vector<std::int64_t>{16, 32, 64, 128, 256, 512, 1024};
  for (std::int64_t s : cube) gemm.insert({s, s, s, false, false, dtype, dtype});
  for (std::int64_t seq : quick ? std::vector<std::int64_t>{64, 256} : std::vector<std::int64_t>{32, 64, 128, 256, 512})
    attention.insert({1, 8, seq, 64, true, 0, dtype});
  const int step = quick ? 4 : 2;  // powers of two of element counts
  for (const OpInfo* info : per_op_measured()) {
    const std::string op(info->cost_name);
    switch (info->grid) {
      case Grid::scalar: ops.insert({op, 1, 1, DType::f32}); break;
      case Grid::rows:  // per-row statistics only
        for (int e = 6; e <= 16; e += step) ops.insert({op, std::int64_t{1} << e, 1, DType::f32});
        break;
      case Grid::matrix:
        for (int e = 10; e <= (quick ? 20 : 22); e += step) {
          const std::int64_t elems = std::int64_t{1} << e, cols = std::min<std::int64_t>(elems, 256);
          ops.insert({op, elems / cols, cols, dtype});
        }
        break;
    }
  }
}

std::string first_line_field(const char* path, const char* key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) {
      auto p = line.find(':');
      if (p == std::string::npos) continue;
      auto v = line.substr(p + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  return "";
}

sim::Calibration::Machine describe_machine(const std::string& backend) {
  sim::Calibration::Machine m;
  m.backend = backend;
  m.cpu = first_line_field("/proc/cpuinfo", "model name");
  if (m.cpu.empty()) m.cpu = "unknown (no /proc/cpuinfo)";
  m.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::string blas = openblas_get_config();  // "OpenBLAS 0.3.21 DYNAMIC_ARCH ..."
  std::istringstream words(blas);
  std::string name, version;
  words >> name >> version;
  // Its kernels too: OPENBLAS_CORETYPE or its own choice (on this VM Haswell's AVX2 and Cooperlake's
  // AVX-512 kernels differ by 1.9x).
  m.libraries.emplace_back("OpenBLAS", fmt::format("{} ({} kernels)", version.empty() ? blas : version,
                                                   openblas_get_corename()));
  m.libraries.emplace_back("oneTBB", TBB_VERSION_STRING);
  m.libraries.emplace_back("Open MPI", fmt::format("{}.{}.{}", OMPI_MAJOR_VERSION,
                                                   OMPI_MINOR_VERSION, OMPI_RELEASE_VERSION));
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  m.date = date;
  return m;
}

// One progress line, rewritten in place on a terminal; into a file or a pipe
// (a log), a line per finished measurement group and never a '\r'.
class ProgressLine {
 public:
  void show(const std::string& what, std::size_t done, std::size_t total) {
    const double s = std::chrono::duration<double>(Clock::now() - start_).count();
    if (!terminal_) {
      if (done == total) std::fprintf(stderr, "calibrate [%6.1f s] %s %zu/%zu\n", s, what.c_str(), done, total);
      return;
    }
    std::fprintf(stderr, "\rcalibrate [%6.1f s] %-40s %zu/%zu   ", s, what.c_str(), done, total);
    if (done == total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_ = Clock::now();
  bool terminal_ = isatty(STDERR_FILENO) != 0;
};

// A reusable barrier for the rank threads of one sharing level.
class ThreadBarrier {
 public:
  explicit ThreadBarrier(int n) : n_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const std::uint64_t gen = generation_;
    if (++waiting_ == n_) {
      waiting_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen; });
  }

 private:
  const int n_;
  std::mutex mu_;  // guards waiting_ and generation_
  std::condition_variable cv_;
  int waiting_ = 0;
  std::uint64_t generation_ = 0;
};

// Runs the compute measurements at `sharing` ranks at once; rank 0's results go into `cal`.
Status measure_compute(int sharing, const std::vector<GemmShape>& gemm,
                       const std::vector<GroupedGemmShape>& grouped, const std::vector<AttentionShape>& attention,
                       const std::vector<OpShape>& ops, const calibrate::Timing& timing, int rank_threads,
                       sim::Calibration& cal, ProgressLine& progress) {
  ThreadBarrier barrier(sharing);
  std::vector<Status> status(static_cast<std::size_t>(sharing));
  auto body = [&](int rank) {
    // Each rank thread gets its share of the cores, as `meshtrain train` gives it.
    // (The cpu backend's name is known; make_backend cannot refuse it, so no
    // rank leaves its peers waiting at the barrier.)
    auto made = make_backend({.name = "cpu", .threads = rank_threads, .ranks_sharing = sharing});
    if (!made) return void(status[static_cast<std::size_t>(rank)] = std::move(made).error());
    Backend& b = **made;
    calibrate::Sync sync = sharing > 1 ? calibrate::Sync([&] { barrier.arrive_and_wait(); })
                                       : calibrate::Sync{};
    auto show = [&](const char* what, std::size_t total) {
      return [&progress, rank, what, total, sharing](std::size_t done) {
        if (rank == 0) progress.show(fmt::format("{} (ranks sharing: {})", what, sharing), done, total);
      };
    };
    auto g = calibrate::measure_gemm(b, gemm, timing, sync, sharing, show("gemm", gemm.size()));
    if (!g) return void(status[static_cast<std::size_t>(rank)] = std::move(g).error());
    auto gg = calibrate::measure_grouped_gemm(b, grouped, timing, sync, sharing, show("grouped gemm", grouped.size()));
    if (!gg) return void(status[static_cast<std::size_t>(rank)] = std::move(gg).error());
    std::vector<sim::Calibration::Op> score_terms;
    auto a = calibrate::measure_attention(b, attention, timing, sync, sharing,
                                          show("attention", attention.size()), score_terms);
    if (!a) return void(status[static_cast<std::size_t>(rank)] = std::move(a).error());
    auto o = calibrate::measure_ops(b, ops, timing, sync, sharing, show("memory-bound ops", ops.size()));
    if (!o) return void(status[static_cast<std::size_t>(rank)] = std::move(o).error());
    if (rank != 0) return;
    cal.gemm.insert(cal.gemm.end(), g->begin(), g->end());
    cal.grouped_gemm.insert(cal.grouped_gemm.end(), gg->begin(), gg->end());
    cal.attention.insert(cal.attention.end(), a->begin(), a->end());
    cal.ops.insert(cal.ops.end(), score_terms.begin(), score_terms.end());
    for (const auto& e : *o) {
      cal.ops.push_back(e);
      if (e.op == "copy") cal.memory.push_back({e.bytes, e.time_us, e.spread});
    }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < sharing; ++r) threads.emplace_back(body, r);
  body(0);
  for (auto& t : threads) t.join();
  for (auto& s : status) MT_TRY(s);
  return ok_status();
}

std::vector<double> comm_sizes(bool quick) {
  std::vector<double> s;
  for (int e = 12; e <= (quick ? 20 : 24); e += quick ? 4 : 2) s.push_back(std::ldexp(1.0, e));
  return s;
}

Group world_group(int n) {
  Group g;
  g.id = 1 << 30;  // apart from any mesh group id
  for (int r = 0; r < n; ++r) g.ranks.push_back(r);
  return g;
}

// Collectives and the link among `members` rank threads; rank 0's results go into `cal`.
Status measure_threads(int members, bool quick, const calibrate::Timing& timing, int threads,
                       sim::Calibration& cal, ProgressLine& progress) {
  const std::vector<double> sizes = comm_sizes(quick);
  const std::size_t total = sizes.size() * (members == 2 ? 6 : 5);
  return run_thread_ranks({.name = "cpu", .threads = threads}, members, [&](int rank, Backend& b) -> Status {
    const Group g = world_group(members);
    auto show = [&](std::size_t done) {
      if (rank == 0) progress.show(fmt::format("collectives, {} threads", members), done, total);
    };
    MT_ASSIGN(auto entries, calibrate::measure_collectives(b, g, sizes, timing, "threads", show));
    if (members == 2) {
      MT_ASSIGN(auto link, calibrate::measure_link(b, g, sizes.back(), timing));
      if (rank == 0) cal.links.push_back(link);
    }
    if (rank == 0) cal.collectives.insert(cal.collectives.end(), entries.begin(), entries.end());
    return b.synchronize();
  });
}

template <class T>
std::vector<T> sorted(const std::set<T>& s) {
  return {s.begin(), s.end()};
}

// Saves the finished calibration and says what it holds.
Status write_calibration(const sim::Calibration& cal, const std::string& path) {
  MT_TRY(sim::save_calibration(cal, path));
  std::fprintf(stderr,
               "calibrate: wrote %s (precision %s: %zu gemm, %zu grouped gemm, %zu attention, %zu ops, %zu "
               "collectives)\n",
               path.c_str(), sim::dtype_name(cal.precision), cal.gemm.size(), cal.grouped_gemm.size(),
               cal.attention.size(), cal.ops.size(), cal.collectives.size());
  return ok_status();
}

// The same measurements on the cuda backend: kernels on rank 0's GPU (one
// rank per device, so ranks_sharing 1 only) and, under mpirun, the
// collectives of all ranks over the backend's own communicator (NCCL; no
// transport named).
Status calibrate_cuda(const CalibrateFlags& f, Precision precision, const std::vector<GemmShape>& gemm,
                      const std::vector<GroupedGemmShape>& grouped, const std::vector<AttentionShape>& attention, const std::vector<OpShape>& ops,
                      const calibrate::Timing& timing, MpiEnvironment* env) {
  // Peers wait while rank 0 measures kernels.
  const BackendRequest request{.name = "cuda", .comm_timeout = std::chrono::hours(2)};
  std::optional<MpiRankBackend> mpi_rank;
  std::unique_ptr<Backend> alone;
  if (env) {
    MT_ASSIGN(MpiRankBackend rank, MpiRankBackend::create(request));
    mpi_rank.emplace(std::move(rank));
  } else {
    MT_ASSIGN(alone, make_backend(request));
  }
  Backend* b = env ? &mpi_rank->backend() : alone.get();
  const bool leader = b->rank() == 0;
  sim::Calibration cal;
  cal.precision = precision == Precision::fp32 ? sim::DType::kFp32 : sim::DType::kBf16;
  cal.machine = describe_machine("cuda");
  // The GPU's own name: simulate checks it against the cluster's device.
  cal.device = fmt::format("{} (cuda backend)", backend_device_name("cuda"));
  ProgressLine progress;
  if (leader) {
    auto show = [&](const char* what, std::size_t total) {
      return [&progress, what, total](std::size_t done) { progress.show(what, done, total); };
    };
    MT_ASSIGN(cal.gemm, calibrate::measure_gemm(*b, gemm, timing, {}, 1, show("gemm", gemm.size())));
    // A bf16 calibration also stands for precision fp8 runs (their attention and memory-bound ops are
    // bf16): their GEMMs' FP8 times, fast and split accumulator, where the device has FP8 tensor cores.
    if (precision == Precision::bf16) {
      const calibrate::Fp8GemmCall make = [b](std::int64_t m, std::int64_t n, std::int64_t k, bool split) {
        return backend_fp8_gemm_call(*b, m, n, k, split);
      };
      auto fp8 = calibrate::measure_fp8_gemm(*b, gemm, make, timing, show("fp8 gemm", gemm.size()));
      if (fp8) cal.gemm.insert(cal.gemm.end(), fp8->begin(), fp8->end());
      else cal.machine.notes.push_back(fmt::format("fp8 gemm: not measured ({})", fp8.error().message()));
    }
    MT_ASSIGN(cal.grouped_gemm,
              calibrate::measure_grouped_gemm(*b, grouped, timing, {}, 1, show("grouped gemm", grouped.size())));
    std::vector<sim::Calibration::Op> score_terms;
    MT_ASSIGN(cal.attention, calibrate::measure_attention(*b, attention, timing, {}, 1,
                                                          show("attention", attention.size()), score_terms));
    MT_ASSIGN(cal.ops, calibrate::measure_ops(*b, ops, timing, {}, 1,
                                              show("memory-bound ops", ops.size())));
    cal.ops.insert(cal.ops.end(), score_terms.begin(), score_terms.end());
    for (const auto& e : cal.ops)
      if (e.op == "copy") cal.memory.push_back({e.bytes, e.time_us, e.spread});
  }
  if (b->world_size() >= 2) {
    const std::vector<double> sizes = comm_sizes(f.quick);
    auto show = [&](std::size_t done) {
      if (leader) progress.show("collectives", done, sizes.size() * (b->world_size() == 2 ? 6 : 5));
    };
    auto entries = calibrate::measure_collectives(*b, world_group(b->world_size()), sizes, timing,
                                                  "", show);
    if (!entries) abort_job(entries.error());
    cal.collectives = std::move(entries).value();
  } else {
    cal.machine.notes.push_back(
        "collectives: not measured (one rank; run under mpirun -np N for NCCL collectives)");
  }
  if (!leader) return ok_status();
  return write_calibration(cal, f.out);
}

// The sharing levels kernels are measured at (--sharing, default 1 and 2), sorted and unique.
Result<std::vector<int>> sharing_levels(const CalibrateFlags& f) {
  std::vector<int> sharing = f.sharing.empty() ? std::vector<int>{1, 2} : f.sharing;
  for (int s : sharing)
    if (s < 1 || s > 64) return make_error("--sharing {} must be in [1, 64]", s);
  std::sort(sharing.begin(), sharing.end());
  sharing.erase(std::unique(sharing.begin(), sharing.end()), sharing.end());
  return sharing;
}

// The shapes to measure: the --workload steps' own, the grid's unless
// --no-grid, and the plain GEMMs the grouped ones are compared with.
Result<calibrate::WorkloadShapes> shapes_to_measure(const CalibrateFlags& f, Precision precision, DType dtype) {
  calibrate::WorkloadShapes shapes;
  for (const std::string& w : f.workloads) {
    MT_ASSIGN(calibrate::Workload wl, calibrate::parse_workload(w, "--workload"));
    // Recording runs the workload's step on the sim backend with a real
    // batch on the host: refuse a shape that cannot fit before that, from
    // its widest activation (the logits, or the MLP's), as check_shapes_fit
    // would after.
    const ModelSpec& m = wl.model;
    const double widest = std::max({static_cast<double>(m.vocab), static_cast<double>(m.ffn), 3.0 * m.hidden});
    MT_TRY(check_host_memory(4.0 * 4 * static_cast<double>(wl.batch) * static_cast<double>(wl.seq) * widest,
                             "measuring the largest --workload shape",
                             "use a smaller micro-batch, sequence length or model in --workload"));
    MT_TRY(calibrate::record_workload_shapes(wl.model, wl.batch, wl.seq, precision, shapes));
  }
  if (!f.no_grid) {
    grid_shapes(f.quick, dtype, shapes.gemm, shapes.attention, shapes.ops);
    const std::set<GroupedGemmShape> grid = calibrate::grouped_gemm_grid(f.quick, f.backend == "cuda", dtype);
    shapes.grouped.insert(grid.begin(), grid.end());
  }
  const std::set<GemmShape> plain = calibrate::plain_gemms_of(shapes.grouped);
  shapes.gemm.insert(plain.begin(), plain.end());
  if (shapes.gemm.empty() && shapes.attention.empty() && shapes.ops.empty())
    return make_error("--no-grid needs at least one --workload");
  MT_TRY(check_shapes_fit(shapes.gemm, shapes.attention, shapes.ops));
  return shapes;
}

// How each shape is sampled: --quick, and the median or (--statistic mean) the mean.
Result<calibrate::Timing> timing_of(const CalibrateFlags& f) {
  calibrate::Timing timing;
  if (f.quick) timing = {5, 1e-3};
  if (f.statistic != "median" && f.statistic != "mean")
    return Error(unknown_name_message("--statistic", f.statistic, {"median", "mean"}));
  timing.mean = f.statistic == "mean";
  // A mean stands for the load only when each sample spans several
  // scheduler slices (a few ms each): a sample of >= 20 ms does.
  if (timing.mean) timing = {f.quick ? 3 : 5, 20e-3, true};
  if (f.quick) timing.max_cold_bytes = 64.0 * (1 << 20);
  return timing;
}

// Under mpirun: the collectives among the job's processes (transport "mpi"),
// after rank 0 measured the rest; otherwise a note saying how to add them.
Status measure_mpi_collectives(const CalibrateFlags& f, MpiEnvironment* env, const calibrate::Timing& timing,
                               sim::Calibration& cal, ProgressLine& progress) {
  if (!env) {
    cal.machine.notes.push_back(
        "mpi: not measured (not launched by mpirun; run `mpirun -np N meshtrain calibrate ...` "
        "to add transport \"mpi\" collectives)");
    return ok_status();
  }
  const bool leader = env->rank() == 0;
  // Peers wait asleep while rank 0 measures the rest: blocked inside MPI
  // they would busy-poll the cores the kernels are timed on (that made
  // every kernel of an mpirun -np 2 calibration ~1.6x slower on 2 cores).
  MT_TRY(env->barrier_asleep());
  MT_ASSIGN(MpiRankBackend rank, MpiRankBackend::create({.name = "cpu", .threads = f.threads,
                                                         .comm_timeout = std::chrono::hours(2)}));
  Backend& b = rank.backend();
  const std::vector<double> sizes = comm_sizes(f.quick);
  auto show = [&](std::size_t done) {
    if (leader) progress.show(fmt::format("collectives, {} MPI ranks", env->world_size()), done,
                              sizes.size() * (env->world_size() == 2 ? 6 : 5));
  };
  if (env->world_size() < 2) {
    cal.machine.notes.push_back("mpi: not measured (mpirun started a single process)");
    return ok_status();
  }
  auto entries = calibrate::measure_collectives(b, world_group(env->world_size()), sizes, timing, "mpi", show);
  if (!entries) abort_job(entries.error());
  cal.collectives.insert(cal.collectives.end(), entries->begin(), entries->end());
  return ok_status();
}

Status run_calibrate(const CalibrateFlags& f) {
  if (!f.profile.empty()) {
    if (f.calibration.empty())
      return make_error("--profile needs --calibration FILE (from `meshtrain calibrate --out`)");
    return calibrate::print_op_profile({f.profile, f.calibration, f.profile_steps, f.profile_budget_s,
                                        f.profile_ranks, f.threads});
  }
  MT_TRY(check_backend_name(f.backend));
  MT_ASSIGN(const Precision precision, precision_for_backend(f.backend, f.precision));
  const DType dtype = precision == Precision::fp32 ? DType::f32 : DType::bf16;
  if (f.out.empty()) return make_error("--out FILE is required (where the calibration is written)");
  // Before the measurement, not after it: an unwritable --out would waste it.
  MT_TRY(probe_output_file(f.out, "--out calibration file"));
  const int cores = available_cpu_cores();
  const int max_ranks = f.max_ranks > 0 ? f.max_ranks : std::max(2, cores);
  if (max_ranks < 2 || max_ranks > 64)
    return make_error("--max-ranks {} must be in [2, 64]", max_ranks);
  MT_ASSIGN(const std::vector<int> sharing, sharing_levels(f));
  MT_ASSIGN(const calibrate::WorkloadShapes shapes, shapes_to_measure(f, precision, dtype));
  MT_ASSIGN(const calibrate::Timing timing, timing_of(f));

  MT_ASSIGN(auto launch, detect_launch());
  std::unique_ptr<MpiEnvironment> env;
  if (launch) {
    MT_ASSIGN(env, MpiEnvironment::init(nullptr, nullptr));
  }
  const bool leader = !env || env->rank() == 0;

  if (f.backend == "cuda")
    return calibrate_cuda(f, precision, sorted(shapes.gemm), sorted(shapes.grouped), sorted(shapes.attention),
                          sorted(shapes.ops), timing, env.get());
  sim::Calibration cal;
  cal.precision = sim::DType::kFp32;  // precision_for_backend refused any other on the cpu backend
  cal.machine = describe_machine(f.backend);
  cal.device = fmt::format("{} ({} cores, cpu backend)", cal.machine.cpu, cal.machine.cores);
  ProgressLine progress;
  if (leader) {
    for (int s : sharing)
      MT_TRY(measure_compute(s, sorted(shapes.gemm), sorted(shapes.grouped), sorted(shapes.attention),
                             sorted(shapes.ops), timing, f.threads, cal, progress)
                 .context(fmt::format("measuring kernels with {} ranks sharing", s)));
    for (int n = 2; n <= max_ranks; ++n)
      MT_TRY(measure_threads(n, f.quick, timing, f.threads, cal, progress)
                 .context(fmt::format("measuring collectives among {} threads", n)));
  }
  MT_TRY(measure_mpi_collectives(f, env.get(), timing, cal, progress));
  std::vector<std::string> levels;
  for (int s : sharing) levels.push_back(fmt::format("{} x {} thread(s)", s, cpu_threads_per_rank(f.threads, s)));
  cal.machine.notes.push_back(fmt::format(
      "kernels measured with {} rank thread(s) running at once (ranks_sharing), each with threads of its own "
      "({} of {} cores); collectives among 2..{} threads; time_us is the {} of the samples",
      fmt::join(sharing, ", "), fmt::join(levels, ", "), cores, max_ranks, f.statistic));
  if (!leader) return ok_status();
  return write_calibration(cal, f.out);
}

}  // namespace

Command add_calibrate_command(CLI::App& app) {
  auto f = std::make_shared<CalibrateFlags>();
  CLI::App* sub = app.add_subcommand(
      "calibrate", "measure this machine's kernels and communicators into a simulator calibration file");
  sub->add_option("--backend", f->backend, "cpu or cuda")
      ->capture_default_str();
  sub->add_option("--precision", f->precision,
                  "fp32 or bf16: the dtype of the measured kernels, as the runs simulated with the file train "
                  "(default: train's on the backend, fp32 on cpu, bf16 on cuda); simulate refuses a calibration "
                  "of another precision than its run's");
  sub->add_option("--out", f->out, "calibration JSON to write (required unless --profile)");
  sub->add_flag("--quick", f->quick, "fewer shapes and samples, operands cycled through at most 64 MiB (seconds, for tests)");
  sub->add_flag("--no-grid", f->no_grid, "measure only the --workload shapes (no log-spaced grids)");
  sub->add_option("--statistic", f->statistic,
                  "time_us of an entry: median of the samples (idle-machine speed) or mean "
                  "(under the current load, for a shared machine)")
      ->capture_default_str();
  sub->add_option("--workload", f->workloads,
                  "MODEL:MICRO_BATCH:SEQ_LEN whose exact shapes are measured (repeatable)")
      ->capture_default_str();
  sub->add_option("--sharing", f->sharing,
                  "rank threads running the kernels at once, one level per value (default 1 2)")
      ->check(int_in({1, 64}));
  sub->add_option("--threads", f->threads,
                  "cpu backend: threads per rank thread, as train's --threads (default: this process's cores "
                  "divided among the rank threads of each --sharing level, as train divides them)")
      ->check(int_in({0, max_cpu_threads_per_rank()}));
  sub->add_option("--max-ranks", f->max_ranks, "largest in-process group measured (default max(2, cores))")
      ->check(int_in({0, 64}));
  sub->add_option("--profile", f->profile,
                  "instead: compare a real single-rank step of MODEL:B:T with its simulation, op by op, on the "
                  "backend and at the precision of --calibration");
  sub->add_option("--calibration", f->calibration, "with --profile: the calibration to simulate with");
  sub->add_option("--profile-steps", f->profile_steps, "with --profile: steps averaged, at most")
      ->capture_default_str()
      ->check(int_in({1, 1 << 20}));
  sub->add_option("--profile-budget", f->profile_budget_s,
                  "with --profile: seconds of timed steps after which no further step starts (at least one runs)")
      ->capture_default_str()
      ->check(real_in({0, 3600}));
  sub->add_option("--profile-ranks", f->profile_ranks,
                  "with --profile: independent ranks running at once (threads)")
      ->capture_default_str()
      ->check(int_in({1, 64}));
  return {sub, [f] { return run_calibrate(*f); }};
}

}  // namespace meshtrain
