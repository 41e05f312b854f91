#include "engine/tracing/trace_merge.h"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace meshtrain {

namespace {

// Microseconds with three decimals from integer nanoseconds; a negative time
// (a rank's event before rank 0's recorder began) keeps its sign on the whole.
std::string us(std::int64_t ns) {
  const char* sign = ns < 0 ? "-" : "";
  const std::uint64_t magnitude = ns < 0 ? 0 - static_cast<std::uint64_t>(ns) : static_cast<std::uint64_t>(ns);
  return fmt::format("{}{}.{:03}", sign, magnitude / 1000, magnitude % 1000);
}

std::string quote(const std::string& s) { return nlohmann::json(s).dump(); }

void append(std::string& out, const std::string& object) {
  if (!out.empty()) out += ",\n";
  out += object;
}

std::string metadata_json(int rank, const RankTrace& t, const ClockOffset& clock, bool estimated) {
  std::string clock_args;
  if (estimated)
    clock_args = fmt::format(R"(,"clock_offset_ns":{},"clock_uncertainty_ns":{})", clock.offset_ns,
                             clock.uncertainty_ns);
  std::string out = fmt::format(R"({{"ph":"M","pid":{},"name":"process_name","args":{{"name":{}{}}}}})", rank,
                                quote(t.label), clock_args);
  for (const auto& [id, name] : t.streams)
    append(out, fmt::format(R"({{"ph":"M","pid":{},"tid":{},"name":"thread_name","args":{{"name":{}}}}})", rank,
                            id, quote(name)));
  return out;
}

// One op as a complete event, its start moved by `offset_ns`.
std::string event_json(int rank, const RankTrace& t, const TraceEvent& e, std::int64_t offset_ns) {
  std::string out = fmt::format(R"({{"ph":"X","pid":{},"tid":{},"name":"{}","cat":"{}","ts":{},"dur":{})", rank,
                                e.stream, e.name, e.category, us(e.start_ns + offset_ns), us(e.duration_ns));
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
  return out;
}

}  // namespace

TraceFragment render_rank_trace(int rank, const RankTrace& trace, const ClockOffset& clock, bool estimated) {
  TraceFragment f{rank, metadata_json(rank, trace, clock, estimated), {}};
  for (const TraceEvent& e : trace.events) append(f.events, event_json(rank, trace, e, clock.offset_ns));
  return f;
}

std::string merge_fragments(std::vector<TraceFragment> fragments) {
  std::stable_sort(fragments.begin(), fragments.end(),
                   [](const TraceFragment& a, const TraceFragment& b) { return a.rank < b.rank; });
  std::string body;
  for (const TraceFragment& f : fragments)
    if (!f.metadata.empty()) append(body, f.metadata);
  for (const TraceFragment& f : fragments)
    if (!f.events.empty()) append(body, f.events);
  return "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n" + body + "\n]}\n";
}

std::string merged_trace_json(const std::map<int, RankTrace>& ranks, const std::map<int, ClockOffset>& clocks) {
  std::vector<TraceFragment> fragments;
  for (const auto& [rank, trace] : ranks) {
    const auto clock = clocks.find(rank);
    fragments.push_back(clock == clocks.end() ? render_rank_trace(rank, trace, {}, false)
                                              : render_rank_trace(rank, trace, clock->second, true));
  }
  return merge_fragments(std::move(fragments));
}

// Each fragment as "<rank> <metadata bytes> <events bytes>\n" and the two texts.
std::string pack_fragments(const std::vector<TraceFragment>& fragments) {
  std::string out;
  for (const TraceFragment& f : fragments) {
    out += fmt::format("{} {} {}\n", f.rank, f.metadata.size(), f.events.size());
    out += f.metadata;
    out += f.events;
  }
  return out;
}

Result<std::vector<TraceFragment>> unpack_fragments(std::string_view packed) {
  std::vector<TraceFragment> out;
  while (!packed.empty()) {
    const std::size_t end = packed.find('\n');
    if (end == std::string_view::npos)
      return make_error("a packed trace fragment's header has no end (after {} fragments)", out.size());
    std::int64_t numbers[3] = {};
    const char* at = packed.data();
    for (std::int64_t& n : numbers) {
      while (at < packed.data() + end && *at == ' ') ++at;
      auto [next, ec] = std::from_chars(at, packed.data() + end, n);
      if (ec != std::errc() || n < 0)
        return make_error("a packed trace fragment's header '{}' is not three counts", packed.substr(0, end));
      at = next;
    }
    if (at != packed.data() + end)
      return make_error("a packed trace fragment's header '{}' is not three counts", packed.substr(0, end));
    const auto meta = static_cast<std::size_t>(numbers[1]), events = static_cast<std::size_t>(numbers[2]);
    packed.remove_prefix(end + 1);
    if (packed.size() < meta + events)
      return make_error("rank {}'s packed trace fragment holds {} bytes, its header says {}", numbers[0],
                        packed.size(), meta + events);
    out.push_back({static_cast<int>(numbers[0]), std::string(packed.substr(0, meta)),
                   std::string(packed.substr(meta, events))});
    packed.remove_prefix(meta + events);
  }
  return out;
}

}  // namespace meshtrain
