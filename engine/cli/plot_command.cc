// `meshtrain plot METRICS.jsonl --out FILE.svg`: the loss curve of a run
// (engine/pictures/pictures.h), from the metrics file `train --metrics` writes.
#include <memory>

#include <fmt/format.h>

#include "core/input_file.h"
#include "engine/cli/commands.h"
#include "engine/pictures/pictures.h"

namespace meshtrain {

namespace {

struct PlotFlags {
  std::string metrics, out, title;
};

Status run_plot(const PlotFlags& f) {
  MT_TRY(probe_output_file(f.out, "--out picture"));
  // A long run's metrics outgrow the cap on model and plan files.
  MT_ASSIGN(std::string text, read_input_file(f.metrics, "metrics file", std::size_t{1} << 30));
  MT_ASSIGN(std::vector<pictures::MetricsRow> rows, pictures::parse_metrics(text, f.metrics));
  const std::string title = f.title.empty() ? fmt::format("Loss: {}", f.metrics) : f.title;
  MT_TRY(write_output_file(f.out, pictures::loss_svg(rows, title), "--out picture"));
  fmt::print("wrote {} ({} steps, last loss {:.4f})\n", f.out, rows.size(), rows.back().loss);
  return {};
}

}  // namespace

Command add_plot_command(CLI::App& app) {
  auto f = std::make_shared<PlotFlags>();
  CLI::App* sub = app.add_subcommand("plot", "draw a run's loss curve (and validation loss, learning rate) as SVG");
  sub->add_option("metrics", f->metrics, "metrics file (JSON lines with step, loss[, val_loss, lr]: train --metrics)")
      ->required();
  sub->add_option("--out", f->out, "SVG file to write")->required();
  sub->add_option("--title", f->title, "title above the plot (default: the metrics file's name)");
  return {sub, [f] { return run_plot(*f); }};
}

}  // namespace meshtrain
