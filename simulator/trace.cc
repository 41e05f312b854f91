#include "simulator/trace.h"

#include <nlohmann/json.hpp>

#include "core/input_file.h"

namespace meshtrain::sim {
namespace {

// Microseconds with exactly six decimals from integer picoseconds.
std::string us(Time ps) { return fmt::format("{}.{:06}", ps / 1'000'000, ps % 1'000'000); }

// JSON string literal with escaping, via nlohmann so it matches the spec.
std::string quote(const std::string& s) { return nlohmann::json(s).dump(); }

}  // namespace

void Trace::name_process(int pid, std::string_view name) {
  meta_.push_back({pid, -1, names_.intern(name)});
}

void Trace::name_thread(int pid, int tid, std::string_view name) {
  meta_.push_back({pid, tid, names_.intern(name)});
}

void Trace::complete(int pid, int tid, std::string_view name, std::string_view category, Time start,
                     Time duration) {
  events_.push_back(
      {Ph::kComplete, pid, tid, names_.intern(name), names_.intern(category), start, duration, 0});
}

void Trace::flow_start(int pid, int tid, uint64_t id, Time at) {
  events_.push_back(
      {Ph::kFlowStart, pid, tid, names_.intern("p2p"), names_.intern("p2p"), at, 0, id});
}

void Trace::flow_end(int pid, int tid, uint64_t id, Time at) {
  events_.push_back(
      {Ph::kFlowEnd, pid, tid, names_.intern("p2p"), names_.intern("p2p"), at, 0, id});
}

void Trace::idle(int pid, int tid, std::string_view cause, Time start, Time duration) {
  const NameId name = names_.intern(cause);
  events_.push_back({Ph::kIdle, pid, tid, name, names_.intern("idle"), start, duration, events_.size()});
}

std::string Trace::to_json() const {
  std::string out = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  bool first = true;
  auto sep = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  for (const Meta& m : meta_) {
    sep();
    if (m.tid < 0)
      out += fmt::format(R"({{"ph":"M","pid":{},"name":"process_name","args":{{"name":{}}}}})",
                         m.pid, quote(names_.name(m.name)));
    else
      out +=
          fmt::format(R"({{"ph":"M","pid":{},"tid":{},"name":"thread_name","args":{{"name":{}}}}})",
                      m.pid, m.tid, quote(names_.name(m.name)));
  }
  for (const Event& e : events_) {
    sep();
    switch (e.ph) {
      case Ph::kComplete:
        out += fmt::format(R"({{"ph":"X","pid":{},"tid":{},"name":{},"cat":{},"ts":{},"dur":{}}})",
                           e.pid, e.tid, quote(names_.name(e.name)), quote(names_.name(e.category)),
                           us(e.start), us(e.duration));
        break;
      case Ph::kFlowStart:
        out += fmt::format(
            R"({{"ph":"s","pid":{},"tid":{},"name":"p2p","cat":"p2p","id":{},"ts":{}}})", e.pid,
            e.tid, e.id, us(e.start));
        break;
      case Ph::kIdle:
        out += fmt::format(
            R"({{"ph":"b","pid":{},"tid":{},"name":{},"cat":"idle","id":{},"ts":{}}},)"
            "\n"
            R"({{"ph":"e","pid":{},"tid":{},"name":{},"cat":"idle","id":{},"ts":{}}})",
            e.pid, e.tid, quote(names_.name(e.name)), e.id, us(e.start), e.pid, e.tid, quote(names_.name(e.name)),
            e.id, us(e.start + e.duration));
        break;
      case Ph::kFlowEnd:
        out += fmt::format(
            R"({{"ph":"f","bp":"e","pid":{},"tid":{},"name":"p2p","cat":"p2p","id":{},"ts":{}}})",
            e.pid, e.tid, e.id, us(e.start));
        break;
    }
  }
  out += "\n]}\n";
  return out;
}

Status Trace::write(const std::string& path) const { return write_output_file(path, to_json(), "trace file"); }

}  // namespace meshtrain::sim
