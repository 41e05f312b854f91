#include "engine/schedule/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <utility>

namespace meshtrain::schedule {

namespace {

// Longest names first so "SA" is not read as a stray "S".
constexpr std::array<std::pair<std::string_view, Action::Kind>, 7> kKindNames = {{
    {"SA", Action::send_act},
    {"RA", Action::recv_act},
    {"SG", Action::send_grad},
    {"RG", Action::recv_grad},
    {"F", Action::forward},
    {"B", Action::backward},
    {"W", Action::weight},
}};

std::string_view kind_name(Action::Kind kind) {
  for (const auto& [name, k] : kKindNames)
    if (k == kind) return name;
  return "?";
}

// Reads a run of decimal digits at the front of `text`, advancing it.
bool take_number(std::string_view& text, int& out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  if (ec != std::errc() || ptr == text.data()) return false;
  text.remove_prefix(static_cast<size_t>(ptr - text.data()));
  return true;
}

// The cell grammar, after the stage: kind microbatch [ "." chunk ].
Result<Action> parse_cell_body(std::string_view token, std::string_view rest, int stage) {
  Action a;
  a.stage = stage;
  bool found = false;
  for (const auto& [name, k] : kKindNames) {
    if (rest.starts_with(name)) {
      a.kind = k;
      rest.remove_prefix(name.size());
      found = true;
      break;
    }
  }
  if (!found) return make_error("action '{}': expected a kind F, B, W, SA, RA, SG or RG", token);
  if (!take_number(rest, a.microbatch))
    return make_error("action '{}': expected a microbatch number after the kind", token);
  if (rest.starts_with('.')) {
    rest.remove_prefix(1);
    if (!take_number(rest, a.chunk))
      return make_error("action '{}': expected a chunk number after '.'", token);
  }
  if (!rest.empty()) return make_error("action '{}': unexpected '{}' at the end", token, rest);
  return a;
}

Status check_in_layout(const PipelineLayout& layout, const Action& a, std::string_view token) {
  if (a.stage >= layout.stages)
    return make_error("action '{}': stage {} is outside the {} stages", token, a.stage,
                      layout.stages);
  if (a.chunk >= layout.chunks_per_stage)
    return make_error("action '{}': chunk {} is outside the {} chunks per stage", token, a.chunk,
                      layout.chunks_per_stage);
  if (a.microbatch >= layout.microbatches)
    return make_error("action '{}': microbatch {} is outside the {} microbatches", token,
                      a.microbatch, layout.microbatches);
  return ok_status();
}

std::vector<std::string_view> split_whitespace(std::string_view text) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
    size_t start = i;
    while (i < text.size() && text[i] != ' ' && text[i] != '\t') ++i;
    if (i > start) out.push_back(text.substr(start, i - start));
  }
  return out;
}

}  // namespace

Status check_layout(const PipelineLayout& layout) {
  if (layout.stages <= 0 || layout.chunks_per_stage <= 0 || layout.microbatches <= 0)
    return make_error(
        "pipeline layout needs positive sizes, got stages={} chunks_per_stage={} "
        "microbatches={}; set each to at least 1",
        layout.stages, layout.chunks_per_stage, layout.microbatches);
  return ok_status();
}

std::string format_cell(const Action& a) {
  if (a.chunk == 0) return fmt::format("{}{}", kind_name(a.kind), a.microbatch);
  return fmt::format("{}{}.{}", kind_name(a.kind), a.microbatch, a.chunk);
}

std::string format_action(const Action& a) { return fmt::format("{}{}", a.stage, format_cell(a)); }

Result<Action> parse_action(std::string_view token) {
  std::string_view rest = token;
  int stage = 0;
  if (!take_number(rest, stage))
    return make_error("action '{}': expected a stage number first, as in '2F0'", token);
  return parse_cell_body(token, rest, stage);
}

std::string format_grid(const std::vector<std::string>& labels,
                        const std::vector<std::vector<std::string>>& cells) {
  size_t label_width = 0;
  for (const auto& l : labels) label_width = std::max(label_width, l.size());
  std::vector<size_t> width;
  for (const auto& row : cells) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t k = 0; k < row.size(); ++k) width[k] = std::max(width[k], row[k].size());
  }
  std::string out;
  for (size_t r = 0; r < labels.size(); ++r) {
    std::string line = fmt::format("{:<{}}", labels[r], label_width);
    for (size_t k = 0; k < cells[r].size(); ++k)
      line += fmt::format(" {:<{}}", cells[r][k], width[k]);
    // Padding after the last cell carries no information and makes
    // hand-written expected grids fragile.
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line;
    out += '\n';
  }
  return out;
}

std::string format_schedule(const Schedule& schedule) {
  std::vector<std::string> labels;
  std::vector<std::vector<std::string>> cells;
  for (size_t r = 0; r < schedule.ranks.size(); ++r) {
    labels.push_back(fmt::format("rank {}:", r));
    std::vector<std::string> row;
    for (const Action& a : schedule.ranks[r]) row.push_back(format_cell(a));
    cells.push_back(std::move(row));
  }
  return format_grid(labels, cells);
}

Result<Schedule> parse_schedule(const PipelineLayout& layout, std::string_view text) {
  MT_TRY(check_layout(layout));
  Schedule schedule;
  schedule.layout = layout;
  schedule.ranks.resize(static_cast<size_t>(layout.stages));
  std::vector<bool> seen(static_cast<size_t>(layout.stages), false);
  int line_no = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++line_no;
    std::vector<std::string_view> tokens = split_whitespace(line);
    if (tokens.empty()) continue;
    int rank = 0;
    std::string_view label = tokens.size() > 1 ? tokens[1] : std::string_view();
    if (tokens[0] != "rank" || !take_number(label, rank) || label != ":")
      return make_error("schedule line {}: expected 'rank R:' at the start, got '{}'", line_no,
                        line);
    if (rank >= layout.stages)
      return make_error("schedule line {}: rank {} is outside the {} stages", line_no, rank,
                        layout.stages);
    if (seen[static_cast<size_t>(rank)])
      return make_error("schedule line {}: rank {} appears twice", line_no, rank);
    seen[static_cast<size_t>(rank)] = true;
    for (size_t t = 2; t < tokens.size(); ++t) {
      auto action = parse_cell_body(tokens[t], tokens[t], rank);
      if (!action.ok())
        return std::move(action).error().context(fmt::format("schedule line {}", line_no));
      auto in_layout = check_in_layout(layout, *action, tokens[t]);
      if (!in_layout.ok())
        return std::move(in_layout).error().context(fmt::format("schedule line {}", line_no));
      schedule.ranks[static_cast<size_t>(rank)].push_back(*action);
    }
  }
  for (int r = 0; r < layout.stages; ++r)
    if (!seen[static_cast<size_t>(r)])
      return make_error("schedule text has no line for rank {} of {}", r, layout.stages);
  return schedule;
}

}  // namespace meshtrain::schedule
