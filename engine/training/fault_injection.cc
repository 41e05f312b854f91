#include "engine/training/fault_injection.h"

#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/bounded.h"
#include "core/last_words.h"
#include "engine/plan/plan.h"

namespace meshtrain {

namespace {

// The signals a fault may raise: the crashes the fatal handlers name, and the uncatchable kill.
constexpr int kFaultSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGKILL};

const char* kind_name(Fault::Kind kind) {
  switch (kind) {
    case Fault::Kind::slow: return "slow";
    case Fault::Kind::hang: return "hang";
    case Fault::Kind::exit: return "exit";
    case Fault::Kind::signal: return "signal";
    case Fault::Kind::throw_: return "throw";
  }
  return "?";
}

}  // namespace

Result<Fault> parse_fault(const std::string& spec) {
  auto bad = [&] {
    return make_error("--fault-inject '{}': write RANK:slow:STEP[:FACTOR], RANK:hang:STEP, RANK:exit:STEP, "
                      "RANK:signal:STEP:SIG or RANK:throw:STEP", spec);
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
  if (parts[1] == "slow") f.kind = Fault::Kind::slow;
  else if (parts[1] == "hang") f.kind = Fault::Kind::hang;
  else if (parts[1] == "exit") f.kind = Fault::Kind::exit;
  else if (parts[1] == "signal") f.kind = Fault::Kind::signal;
  else if (parts[1] == "throw") f.kind = Fault::Kind::throw_;
  else return make_error("--fault-inject '{}': the kind is slow, hang, exit, signal or throw, not '{}'", spec, parts[1]);
  if (f.kind == Fault::Kind::signal) {
    if (parts.size() != 4)
      return make_error("--fault-inject '{}': signal needs the signal to raise: RANK:signal:STEP:SIG, SIG one of SEGV, "
                        "BUS, FPE, ILL, ABRT, KILL", spec);
    const std::string name = parts[3].starts_with("SIG") ? parts[3] : "SIG" + parts[3];
    for (const int signal : kFaultSignals)
      if (name == last_words::signal_name(signal)) f.signal = signal;
    if (f.signal == 0)
      return make_error("--fault-inject '{}': '{}' is not a signal a fault raises: SEGV, BUS, FPE, ILL, ABRT or KILL",
                        spec, parts[3]);
    return f;
  }
  if (parts.size() == 4 && f.kind != Fault::Kind::slow)
    return make_error("--fault-inject '{}': only slow takes a factor", spec);
  // A slow rank at most 1000 times slower: a test's straggler, not a hang (that is `hang`).
  if (parts.size() == 4) MT_TRY(number(parse_real("the slow factor", parts[3], {1, 1000}), f.factor));
  return f;
}

std::string fault_spec(const Fault& f) {
  std::string s = fmt::format("{}:{}:{}", f.rank, kind_name(f.kind), f.step);
  if (f.kind == Fault::Kind::slow) s += fmt::format(":{:g}", f.factor);
  if (f.kind == Fault::Kind::signal) s += fmt::format(":{}", last_words::signal_name(f.signal) + 3);
  return s;
}

Status check_faults(const std::vector<Fault>& faults, int world_size, std::int64_t last_step) {
  for (std::size_t i = 0; i < faults.size(); ++i) {
    const Fault& f = faults[i];
    const std::string spec = fault_spec(f);
    if (f.rank >= world_size)
      return make_error("--fault-inject {}: rank {} is outside the world of {} ranks", spec, f.rank, world_size);
    if (f.step > last_step)
      return make_error("--fault-inject {}: step {} is never reached, the run ends after step {} (--steps or "
                        "--stop-at); inject it at a step in 1..{}", spec, f.step, last_step, last_step);
    if (f.kind == Fault::Kind::hang && world_size == 1)
      return make_error("--fault-inject {}: this run has one rank, so no peer waits for it and nothing can see it "
                        "hang (it would sleep, then finish normally); inject the hang into a run of several ranks "
                        "(e.g. --dp 2), or use {}:exit:{}", spec, f.rank, f.step);
    for (std::size_t j = 0; j < i; ++j) {
      const Fault& g = faults[j];
      if (g.rank == f.rank && g.kind != Fault::Kind::slow && f.kind != Fault::Kind::slow)
        return make_error("--fault-inject {} and {}: rank {} can stop only once (it {} at step {}); give one of them",
                          fault_spec(g), spec, f.rank, g.kind == Fault::Kind::hang ? "hangs" : "dies", g.step);
      if (g.rank == f.rank && g.kind == Fault::Kind::slow && f.kind == Fault::Kind::slow)
        return make_error("--fault-inject {} and {}: rank {} is slowed twice; give one factor", fault_spec(g), spec,
                          f.rank);
    }
  }
  return ok_status();
}

void RankLosses::record_death(int rank, std::int64_t step, std::string message) {
  const std::lock_guard lock(mu_);
  lost_[rank] = {step, false};
  messages_.push_back(std::move(message));
  failed_step_ = failed_step_ == 0 ? step : std::min(failed_step_, step);
}

void RankLosses::record_hang(int rank, std::int64_t step) {
  const std::lock_guard lock(mu_);
  lost_[rank] = {step, true};
}

void RankLosses::record_failure(std::int64_t step) {
  const std::lock_guard lock(mu_);
  failed_step_ = failed_step_ == 0 ? step : std::min(failed_step_, step);
}

Status RankLosses::summarize(Status status, std::int64_t steps) const {
  const std::lock_guard lock(mu_);
  if (status.ok() || failed_step_ == 0) return status;
  if (lost_.empty()) {
    // The engine's own errors already name their step; a peer's timeout, raised below it, does not.
    const std::string& what = status.error().message();
    if (what.find(fmt::format("step {}:", failed_step_)) != std::string::npos)
      return make_error("{}; the run did not complete its {} steps", what, steps);
    return make_error("step {} of {}: {}; the run did not complete its steps", failed_step_, steps, what);
  }
  std::vector<std::string> parts;
  for (const auto& [rank, loss] : lost_)
    parts.push_back(fmt::format("rank {} {}at step {}", rank, loss.hung ? "stopped answering " : "", loss.step));
  std::string message = fmt::format("the run lost {} ({}, by --fault-inject) and stopped at step {} of {}, so it "
                                    "did not complete its steps",
                                    lost_.size() == 1 ? "a rank" : fmt::format("{} ranks", lost_.size()),
                                    fmt::join(parts, ", "), failed_step_, steps);
  // A death's own error adds where the last checkpoint is; a peer's error that came first, what it saw.
  const std::string& first = status.error().message();
  const bool first_is_death = std::any_of(messages_.begin(), messages_.end(),
                                          [&](const std::string& m) { return first.ends_with(m); });
  if (first_is_death) return make_error("{}; {}", message, first.substr(first.find("; ") + 2));
  return make_error("{}; first error: {}", message, first);
}

FaultInjector::FaultInjector(const std::vector<Fault>& faults, int rank, bool process,
                             std::chrono::milliseconds hang_for, RankLosses* losses)
    : rank_(rank), process_(process), hang_for_(hang_for), losses_(losses) {
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
      if (losses_) losses_->record_hang(rank_, step_);
      std::this_thread::sleep_for(hang_for_);
      continue;
    }
    if (f.kind == Fault::Kind::throw_)
      throw std::runtime_error(fmt::format("fault injected: rank {} throws at step {}", rank_, step_));
    if (f.kind == Fault::Kind::signal) {
      std::fprintf(stderr, "meshtrain: fault injected: rank %d raises %s at step %lld\n", rank_,
                   last_words::signal_name(f.signal), static_cast<long long>(step_));
      std::fflush(stderr);
      // A test's crash leaves no core file behind.
      const rlimit no_core{0, 0};
      setrlimit(RLIMIT_CORE, &no_core);
      std::raise(f.signal);
    }
    std::fprintf(stderr, "meshtrain: fault injected: rank %d dies at step %lld\n", rank_, static_cast<long long>(step_));
    std::fflush(stderr);
    if (process_) std::raise(SIGKILL);
    throw InjectedExit();
  }
}

}  // namespace meshtrain
