// `meshtrain compare A.json B.json ...`: simulates plan files (as `plan
// --out` writes them, `simulate --plan` reads them) on one model and cluster
// and prints them side by side: step time, MFU, memory peak per rank and the
// compute stream's idle time by cause.
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/input_file.h"
#include "engine/cli/bounded_flags.h"
#include "engine/cli/commands.h"
#include "engine/cli/plan_flags.h"
#include "engine/pictures/pictures.h"
#include "engine/simulation/simulation.h"
#include "simulator/calibration.h"

namespace meshtrain {

namespace {

struct CompareFlags {
  std::vector<std::string> plans;
  std::string model, cluster = "dgx-a100", calibration;
  SoftwareFlags software;  // the simulated software stack
  std::optional<int> gpus;
  bool json = false, ignore_memory = false, steady_state = false;
};

struct Row {
  std::string name;  // the plan file's name
  Plan plan;
  std::optional<SimulationResult> result;
  pictures::IdleByCause idle;
  std::string error;  // why the simulation refused the plan (e.g. over the device memory)
};

std::string layout_of(const Plan& p) {
  if (!p.segments.empty()) return fmt::format("{} segments", p.segments.size());
  return fmt::format("tp{} pp{} dp{} mb{} z{}{}", p.tp, p.pp, p.dp, p.micro_batch, p.zero,
                     p.recompute == Recompute::none && !p.recompute_modules.any()
                         ? ""
                         : fmt::format(" rc-{}", recompute_label(p)));
}

std::string rank_peaks(const SimulationResult& r) {
  std::string out;
  for (const StageResult& s : r.stages)
    out += fmt::format("{}r{} {}", out.empty() ? "" : ", ", s.rank, human_bytes(static_cast<double>(s.peak_bytes)));
  return out;
}

void print_table(const std::vector<Row>& rows, const ModelSpec& m, const sim::ClusterSpec& c) {
  fmt::print("compared on {} x {} ({}), model {}; idle is the compute stream's, mean over ranks\n",
             rows.front().plan.world_size(), c.device.name, c.name, m.name);
  const std::size_t w = std::max<std::size_t>(
      4, std::max_element(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
           return a.name.size() < b.name.size();
         })->name.size());
  fmt::print("{:<{}} {:<24} {:>9} {:>6} {:>8} {:>9} {:>9} {:>9} {:>9}  {}\n", "plan", w, "layout", "step s", "MFU",
             "bubble", "idle:bub", "idle:comm", "idle:recv", "exp.comm", "peak memory per rank");
  for (const Row& row : rows) {
    if (!row.result) {
      fmt::print("{:<{}} {:<24} not simulated: {}\n", row.name, w, layout_of(row.plan), row.error);
      continue;
    }
    const SimulationResult& r = *row.result;
    fmt::print("{:<{}} {:<24} {:>9.4f} {:>5.1f}% {:>7.1f}% {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f}  {}\n", row.name, w,
               layout_of(row.plan), r.iteration_s, 100 * r.mfu, 100 * r.bubble_fraction, row.idle.bubble_s,
               row.idle.comm_wait_s, row.idle.recv_wait_s, r.exposed_comm_s, rank_peaks(r));
  }
  // The fastest plan that ran, and how much slower each other one is.
  const Row* best = nullptr;
  for (const Row& row : rows)
    if (row.result && (!best || row.result->iteration_s < best->result->iteration_s)) best = &row;
  if (!best) return;
  fmt::print("fastest: {} ({:.4f} s)", best->name, best->result->iteration_s);
  for (const Row& row : rows)
    if (row.result && &row != best)
      fmt::print("; {} +{:.1f}%", row.name, 100 * (row.result->iteration_s / best->result->iteration_s - 1));
  fmt::print("\n");
}

nlohmann::json to_json(const std::vector<Row>& rows, const ModelSpec& m, const sim::ClusterSpec& c) {
  nlohmann::json plans = nlohmann::json::array();
  for (const Row& row : rows) {
    nlohmann::json j = {{"file", row.name}, {"plan", plan_to_json(row.plan)}};
    if (!row.result) {
      j["error"] = row.error;
      plans.push_back(std::move(j));
      continue;
    }
    const SimulationResult& r = *row.result;
    nlohmann::json ranks = nlohmann::json::array();
    for (const StageResult& s : r.stages)
      ranks.push_back({{"rank", s.rank}, {"stage", s.stage}, {"ranks", s.ranks}, {"peak_memory_bytes", s.peak_bytes},
                       {"compute_s", s.compute_s}, {"idle_s", s.idle_s}, {"exposed_comm_s", s.exposed_comm_s}});
    j.update({{"iteration_time_s", r.iteration_s},
              {"tokens_per_s", r.tokens_per_s},
              {"mfu", r.mfu},
              {"bubble_fraction", r.bubble_fraction},
              {"exposed_comm_s", r.exposed_comm_s},
              {"peak_memory_bytes", r.peak_memory_bytes},
              {"peak_memory_rank", r.peak_rank},
              {"idle_by_cause_s",
               {{"bubble", row.idle.bubble_s}, {"waiting_for_communication", row.idle.comm_wait_s},
                {"recv", row.idle.recv_wait_s}}},
              {"ranks", ranks}});
    plans.push_back(std::move(j));
  }
  return {{"model", m.name}, {"cluster", c.name}, {"device_memory_bytes", c.device.memory_bytes}, {"plans", plans}};
}

Status run_compare(const CompareFlags& f) {
  if (f.plans.size() < 2) return make_error("give two or more plan files to compare (plan --out writes them)");
  SimulateOptions options;
  MT_ASSIGN(options.cluster, sim::cluster_spec_by_name_or_file(f.cluster));
  MT_TRY(apply_software_flags(f.software, options));
  options.check_memory = !f.ignore_memory;
  options.steady_state = f.steady_state;
  // The trace is what the idle time by cause is read from (the timeline of simulate --svg).
  options.trace = true;
  sim::Calibration calibration;
  std::vector<Row> rows;
  ModelSpec model;
  for (const std::string& file : f.plans) {
    // The plan as `simulate --model M --plan FILE [--gpus N]` reads it.
    PlanFlags pf;
    pf.model = f.model;
    pf.plan_file = file;
    MT_TRY(dp_from_gpus(pf, f.gpus.value_or(0)));
    MT_ASSIGN(ModelAndPlan mp, resolve_model_and_plan(pf, f.gpus.value_or(0)));
    if (!rows.empty() && mp.plan.world_size() != rows.front().plan.world_size())
      return make_error("plan '{}' uses {} GPUs and '{}' {}: compare plans on one cluster size (or pass --gpus N)",
                        file, mp.plan.world_size(), rows.front().name, rows.front().plan.world_size());
    // The calibration's per-level tables depend on the world size, which the first plan fixes.
    if (rows.empty() && !f.calibration.empty())
      MT_TRY(apply_calibration(f.calibration, "threads", mp.plan.world_size(), mp.plan.precision, calibration,
                               options));
    Row row{std::filesystem::path(file).filename().string(), mp.plan, std::nullopt, {}, {}};
    auto r = simulate_iteration(mp.model, mp.plan, options);
    if (r) {
      MT_ASSIGN(pictures::Timeline timeline, pictures::timeline_from_trace(r->trace_json));
      std::map<int, int> stands_for;
      for (const StageResult& s : r->stages) stands_for[s.rank] = s.ranks;
      row.idle = pictures::idle_by_cause(timeline, stands_for);
      row.result = std::move(r).value();
      row.result->trace_json.clear();  // not kept: a large plan's trace is large
    } else {
      row.error = r.error().message();
    }
    model = std::move(mp.model);
    rows.push_back(std::move(row));
  }
  if (f.json) fmt::print("{}\n", to_json(rows, model, options.cluster).dump(2));
  else print_table(rows, model, options.cluster);
  return {};
}

}  // namespace

Command add_compare_command(CLI::App& app) {
  auto f = std::make_shared<CompareFlags>();
  CLI::App* sub = app.add_subcommand(
      "compare", "simulate plan files side by side on one model and cluster: step time, MFU, memory, idle by cause");
  sub->add_option("plans", f->plans, "plan files (plan --out writes them; simulate --plan reads them)")->required();
  sub->add_option("--model", f->model, "model preset name or JSON model file")->required();
  add_cluster_flags(*sub, f->cluster, f->gpus,
                    "GPUs in the cluster (dp defaults to gpus / (tp·pp·cp) when a plan has none)");
  sub->add_option("--calibration", f->calibration, "calibration JSON (meshtrain calibrate) replacing the defaults");
  add_software_flags(*sub, f->software);
  sub->add_flag("--steady-state", f->steady_state, "time the second of two iterations (as simulate)");
  sub->add_flag("--ignore-memory", f->ignore_memory, "time plans whose peak exceeds the device memory too");
  sub->add_flag("--json", f->json, "print one JSON object");
  return {sub, [f] { return run_compare(*f); }};
}

}  // namespace meshtrain
