#include "engine/tracing/trace_recorder.h"

#include "core/input_file.h"
#include "engine/tracing/trace_merge.h"

namespace meshtrain {

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
  return merged_trace_json(ranks_, {});
}

std::string TraceRecorder::packed_fragments(const ClockOffset& clock) const {
  std::lock_guard lock(mu_);
  std::vector<TraceFragment> fragments;
  for (const auto& [rank, trace] : ranks_) fragments.push_back(render_rank_trace(rank, trace, clock, true));
  return pack_fragments(fragments);
}

Status TraceRecorder::write(const std::string& path) const {
  return write_output_file(path, to_json(), "trace file");
}

Status TraceRecorder::probe(const std::string& path) { return probe_output_file(path, "trace file"); }

}  // namespace meshtrain
