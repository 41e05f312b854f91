#include "backends/comm/launch.h"

#include <charconv>
#include <cstdlib>
#include <string_view>

namespace meshtrain {

namespace {

EnvLookup or_process_env(const EnvLookup& getenv) {
  return getenv ? getenv : EnvLookup([](const char* n) { return std::getenv(n); });
}

// The whole of `text` as an int >= 0; nullopt for anything else (empty,
// signs, trailing characters, out of range).
std::optional<int> non_negative_int(std::string_view text) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

}  // namespace

Result<std::optional<LaunchInfo>> detect_launch(const EnvLookup& getenv) {
  const EnvLookup get = or_process_env(getenv);
  struct Source {
    const char* launcher;
    const char* size;
    const char* rank;
  };
  auto parse = [](const char* name, const char* text) -> Result<int> {
    if (auto v = non_negative_int(text)) return *v;
    return make_error("environment variable {}={} is not a non-negative integer", name, text);
  };
  for (const Source& s : {Source{"mpirun", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"},
                          Source{"pmi", "PMI_SIZE", "PMI_RANK"},
                          Source{"srun", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID"}}) {
    const char* size = get(s.size);
    if (size == nullptr) continue;
    const char* rank = get(s.rank);
    if (rank == nullptr) return make_error("{} is set but {} is not", s.size, s.rank);
    MT_ASSIGN(int world, parse(s.size, size));
    MT_ASSIGN(int r, parse(s.rank, rank));
    if (world < 1 || r >= world)
      return make_error("{}={} and {}={} do not describe a rank of a world", s.size, size, s.rank, rank);
    return std::optional<LaunchInfo>(LaunchInfo{s.launcher, world, r});
  }
  return std::optional<LaunchInfo>();
}

Result<std::optional<int>> local_rank_from_env(const EnvLookup& getenv) {
  const EnvLookup get = or_process_env(getenv);
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"}) {
    const char* v = get(var);
    if (v == nullptr) continue;
    const std::optional<int> value = non_negative_int(v);
    if (!value) return make_error("{}='{}' is not a local rank (a non-negative integer)", var, v);
    return value;
  }
  return std::optional<int>();
}

}  // namespace meshtrain
