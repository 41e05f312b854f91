#include "engine/fault_injection.h"

#include <csignal>
#include <cstdio>
#include <limits>
#include <thread>
#include <type_traits>

#include <fmt/format.h>

#include "core/bounded.h"
#include "engine/plan.h"

namespace meshtrain {

Result<Fault> parse_fault(const std::string& spec) {
  auto bad = [&] {
    return make_error("--fault-inject '{}': write RANK:slow:STEP[:FACTOR], RANK:hang:STEP or RANK:exit:STEP", spec);
  };
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (std::size_t colon; (colon = spec.find(':', start)) != std::string::npos; start = colon + 1)
    parts.push_back(spec.substr(start, colon - start));
  parts.push_back(spec.substr(start));
  if (parts.size() < 3 || parts.size() > 4) return bad();
  Fault f;
  auto number = [&](auto parsed, auto& out) -> Status {
    if (!parsed.ok()) return make_error("--fault-inject '{}': {}", spec, parsed.error().message());
    out = static_cast<std::remove_reference_t<decltype(out)>>(*parsed);
    return ok_status();
  };
  MT_TRY(number(parse_int("the rank", parts[0], {0, kMaxWorldSize - 1}), f.rank));
  MT_TRY(number(parse_int("the step", parts[2], {1, std::numeric_limits<std::int64_t>::max()}), f.step));
  // A slow rank at most 1000 times slower: a test's straggler, not a hang (that is `hang`).
  if (parts.size() == 4) MT_TRY(number(parse_real("the slow factor", parts[3], {1, 1000}), f.factor));
  if (parts[1] == "slow") f.kind = Fault::Kind::slow;
  else if (parts[1] == "hang") f.kind = Fault::Kind::hang;
  else if (parts[1] == "exit") f.kind = Fault::Kind::exit;
  else return make_error("--fault-inject '{}': the kind is slow, hang or exit, not '{}'", spec, parts[1]);
  if (parts.size() == 4 && f.kind != Fault::Kind::slow)
    return make_error("--fault-inject '{}': only slow takes a factor", spec);
  return f;
}

FaultInjector::FaultInjector(const std::vector<Fault>& faults, int rank, bool process,
                             std::chrono::milliseconds hang_for)
    : rank_(rank), process_(process), hang_for_(hang_for) {
  for (const Fault& f : faults)
    if (f.rank == rank) faults_.push_back(f);
}

void FaultInjector::before_communication(double compute_s) {
  for (const Fault& f : faults_) {
    if (f.kind == Fault::Kind::slow) {
      if (step_ >= f.step && compute_s > 0)
        std::this_thread::sleep_for(std::chrono::duration<double>((f.factor - 1) * compute_s));
      continue;
    }
    if (step_ != f.step || fired_step_ == step_) continue;
    fired_step_ = step_;
    if (f.kind == Fault::Kind::hang) {
      std::fprintf(stderr, "meshtrain: fault injected: rank %d stops answering at step %lld\n", rank_,
                   static_cast<long long>(step_));
      std::this_thread::sleep_for(hang_for_);
      continue;
    }
    std::fprintf(stderr, "meshtrain: fault injected: rank %d dies at step %lld\n", rank_, static_cast<long long>(step_));
    std::fflush(stderr);
    if (process_) std::raise(SIGKILL);
    throw InjectedExit();
  }
}

}  // namespace meshtrain
