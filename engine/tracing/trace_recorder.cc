#include "engine/tracing/trace_recorder.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/input_file.h"

namespace meshtrain {

namespace {

// Microseconds with three decimals from integer nanoseconds.
std::string us(std::int64_t ns) { return fmt::format("{}.{:03}", ns / 1000, ns % 1000); }

std::string quote(const std::string& s) { return nlohmann::json(s).dump(); }

}  // namespace

std::int64_t TraceRecorder::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              origin_)
      .count();
}

void RankTrace::add(TraceEvent e, std::string_view event_args) {
  e.args_begin = args.size();
  e.args_size = event_args.size();
  args += event_args;
  events.push_back(e);
}

void TraceRecorder::add_rank(int rank, RankTrace trace) {
  std::lock_guard lock(mu_);
  auto [it, fresh] = ranks_.try_emplace(rank, std::move(trace));
  if (fresh) return;
  RankTrace& into = it->second;
  into.streams.merge(trace.streams);
  for (const TraceEvent& e : trace.events)
    into.add(e, std::string_view(trace.args).substr(e.args_begin, e.args_size));
}

std::string TraceRecorder::to_json() const {
  std::lock_guard lock(mu_);
  std::string out = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  bool first = true;
  auto sep = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  for (const auto& [rank, t] : ranks_) {
    sep();
    out += fmt::format(R"({{"ph":"M","pid":{},"name":"process_name","args":{{"name":{}}}}})", rank,
                       quote(t.label));
    for (const auto& [id, name] : t.streams) {
      sep();
      out += fmt::format(
          R"({{"ph":"M","pid":{},"tid":{},"name":"thread_name","args":{{"name":{}}}}})", rank, id,
          quote(name));
    }
  }
  for (const auto& [rank, t] : ranks_) {
    for (const TraceEvent& e : t.events) {
      sep();
      out += fmt::format(R"({{"ph":"X","pid":{},"tid":{},"name":"{}","cat":"{}","ts":{},"dur":{})",
                         rank, e.stream, e.name, e.category, us(e.start_ns), us(e.duration_ns));
      if (e.device_clock) {
        // The args object with the clock as its last member.
        out += ",\"args\":";
        if (e.args_size > 0) {
          out.append(t.args, e.args_begin, e.args_size - 1);  // without its closing brace
          if (e.args_size > 2) out += ',';
        } else {
          out += '{';
        }
        out += "\"clock\":\"device\"}";
      } else if (e.args_size > 0) {
        out += ",\"args\":";
        out.append(t.args, e.args_begin, e.args_size);
      }
      out += '}';
    }
  }
  out += "\n]}\n";
  return out;
}

Status TraceRecorder::write(const std::string& path) const {
  return write_output_file(path, to_json(), "trace file");
}

Status TraceRecorder::probe(const std::string& path) { return probe_output_file(path, "trace file"); }

std::string rank_trace_path(const std::string& path, int rank) {
  constexpr std::string_view kJson = ".json";
  const std::string suffix = fmt::format(".rank{}.json", rank);
  if (path.size() > kJson.size() && path.ends_with(kJson))
    return path.substr(0, path.size() - kJson.size()) + suffix;
  return path + suffix;
}

}  // namespace meshtrain
