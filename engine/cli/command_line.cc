#include "engine/cli/command_line.h"

#include <map>

#include <fmt/format.h>

#include "core/names.h"

#ifndef MESHTRAIN_VERSION
#define MESHTRAIN_VERSION "unknown"
#endif

namespace meshtrain {

namespace {

// One example per subcommand (by its path below meshtrain), each runnable as
// written from the repository root after ./setup.sh: the train example's
// metrics feed the plot example, the tokenize train example's model the encode one.
const std::map<std::string, std::string>& examples() {
  static const std::map<std::string, std::string> table = {
      {"info", "meshtrain info --model llama3-8b --tp 2 --pp 2 --dp 2 --rank 3"},
      {"train",
       "meshtrain train --model tiny --data README.md --steps 20 --micro-batch 4 --seq-len 64 --metrics run.jsonl"},
      {"simulate", "meshtrain simulate --model gpt2-124m --cluster dgx-a100 --gpus 8 --tp 2 --micro-batch 4"},
      {"goodput", "meshtrain goodput --model gpt3-175b --cluster dgx-a100 --gpus 1024 --iteration-s 12 "
                  "--mtbf-hours 50000"},
      {"plan", "meshtrain plan --model gpt2-124m --gpus 8 --cluster dgx-a100 --top 5 --out plan.json"},
      {"calibrate", "meshtrain calibrate --backend cpu --quick --out calibration.json"},
      {"tokenize", "meshtrain tokenize train --input README.md --model-prefix readme --vocab-size 400"},
      {"tokenize train", "meshtrain tokenize train --input README.md --model-prefix readme --vocab-size 400"},
      {"tokenize encode", "meshtrain tokenize encode --model readme.model --input README.md --out readme.bin"},
      {"tokenize decode", "meshtrain tokenize decode --model readme.model --input readme.bin --out readme.txt"},
      {"generate", "meshtrain generate --checkpoint fox-ckpt --prompt 'the quick' --temperature 0"},
      {"export", "meshtrain export --checkpoint ckpt --format safetensors --out tiny-hf"},
      {"plot", "meshtrain plot run.jsonl --out loss.svg --title 'tiny on README.md'"},
      {"compare", "meshtrain compare experiments/plans/dp8.json experiments/plans/tp2-dp4.json --model gpt2-124m "
                   "--gpus 8"},
  };
  return table;
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::vector<std::string> subcommand_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) names.push_back(sub->get_name());
  return names;
}

std::vector<std::string> flag_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* o : app.get_options())
    for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
  return names;
}

// "did you mean 'x'? " when x is near enough to be a typo of `word` (at most
// half its letters differ: a swap of two letters is two edits), else "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string best = nearest_name(word, candidates);
  if (best.empty() || edit_distance(word, best) * 2 > std::max(word.size(), std::size_t{2})) return "";
  return fmt::format("did you mean '{}'? ", best);
}

// Subcommand `path`'s help (and its subcommands'): its example, and no "[]"
// shown as the default of a repeatable flag, which is only an empty list.
void finish_help(CLI::App& sub, const std::string& path) {
  for (CLI::Option* o : sub.get_options())
    if (o->get_default_str() == "[]") o->default_str("");
  const std::string example = command_example(path);
  if (!example.empty()) sub.footer("\nExample:\n  " + example + "\n\nReference: docs/commands.md");
  for (CLI::App* child : sub.get_subcommands([](const CLI::App*) { return true; }))
    finish_help(*child, path + " " + child->get_name());
}

}  // namespace

std::string meshtrain_version() { return MESHTRAIN_VERSION; }

void configure_app(CLI::App& app) {
  app.set_version_flag("--version", "meshtrain " + meshtrain_version(), "print the version and exit");
  // Subcommands copy the parent's option defaults when they are added.
  app.option_defaults()->always_capture_default();
}

void add_examples(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) finish_help(*sub, sub->get_name());
}

std::string command_example(const std::string& name) {
  const auto it = examples().find(name);
  return it == examples().end() ? std::string() : it->second;
}

std::optional<std::string> explain_unknown_words(const CLI::App& app, const std::vector<std::string>& args) {
  const CLI::App* current = &app;
  std::string path = "meshtrain";
  bool needs_subcommand = true;  // the next plain word must name a subcommand of `current`
  for (const std::string& word : args) {
    if (word == "--") break;  // what follows is not flags
    if (starts_with(word, "--")) {
      const std::string name = word.substr(0, word.find('='));
      if (name == "--version" && current == &app) continue;
      if (current->get_option_no_throw(name) != nullptr) continue;
      return fmt::format("{}: unknown flag '{}'; {}(`{} --help` lists every flag with its default)", path, name,
                         did_you_mean(name, flag_names(*current)), path);
    }
    if (starts_with(word, "-") || !needs_subcommand) continue;  // a short flag, a value or a file
    const CLI::App* sub = nullptr;
    for (const CLI::App* candidate : current->get_subcommands([](const CLI::App*) { return true; }))
      if (candidate->check_name(word)) sub = candidate;
    if (sub == nullptr)
      return fmt::format("{}: unknown subcommand '{}'; {}subcommands: {}", path, word,
                         did_you_mean(word, subcommand_names(*current)), joined(subcommand_names(*current)));
    current = sub;
    path += " " + word;
    needs_subcommand = !current->get_subcommands([](const CLI::App*) { return true; }).empty();
  }
  if (needs_subcommand && current == &app)
    return fmt::format("meshtrain: a subcommand is required: {} (`meshtrain SUBCOMMAND --help` for each)",
                       joined(subcommand_names(app)));
  return std::nullopt;
}

}  // namespace meshtrain
