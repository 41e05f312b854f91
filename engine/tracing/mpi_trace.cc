#include "engine/tracing/mpi_trace.h"

#include <fmt/ranges.h>

#include "backends/comm/root_exchange.h"
#include "core/input_file.h"
#include "engine/tracing/trace_merge.h"

namespace meshtrain {

Status write_mpi_trace(const MpiEnvironment& env, const TraceRecorder& recorder, const std::string& path,
                       std::chrono::milliseconds timeout, std::string& outgoing) {
  // A process whose clock could not be timed sends nothing: rank 0 reports it missing.
  Result<ClockOffset> clock = clock_offset_to_root(env, [&recorder] { return recorder.now_ns(); }, timeout);
  if (!clock.ok() && env.rank() != 0) return std::move(clock.context("--trace")).error();
  outgoing = recorder.packed_fragments(clock.ok() ? *clock : ClockOffset{});
  MT_ASSIGN(const std::vector<std::optional<std::string>> parts,
            gather_to_root(env, outgoing, timeout).context("--trace"));
  if (env.rank() != 0) return ok_status();
  std::vector<TraceFragment> fragments;
  std::vector<int> missing;
  for (std::size_t rank = 0; rank < parts.size(); ++rank) {
    if (!parts[rank]) {
      missing.push_back(static_cast<int>(rank));
      continue;
    }
    MT_ASSIGN(std::vector<TraceFragment> got, unpack_fragments(*parts[rank]).context(fmt::format("rank {}", rank)));
    for (TraceFragment& f : got) fragments.push_back(std::move(f));
  }
  MT_TRY(write_output_file(path, merge_fragments(std::move(fragments)), "trace file"));
  if (!clock.ok()) return std::move(clock.context("--trace")).error();
  if (missing.empty()) return ok_status();
  return make_error("--trace: the trace in '{}' lacks rank {}: no events came within the --comm-timeout of {:g} s",
                    path, fmt::join(missing, ", "), std::chrono::duration<double>(timeout).count());
}

}  // namespace meshtrain
