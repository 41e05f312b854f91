#include "core/last_words.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <ctime>
#include <mutex>

namespace meshtrain::last_words {

namespace {

// What the handlers read. The atomics are lock-free (asserted); the directory
// is written once, before the handlers that read it are installed.
std::atomic<int> g_process_rank{-1};
std::atomic<std::int64_t> g_step{-1}, g_steps{0}, g_saved{0};
std::atomic<bool> g_step_done{false};
std::atomic<int> g_waiting{-1};
std::atomic<std::int64_t> g_wait_start_ns{0};
std::atomic<bool> g_announce{false};
static_assert(std::atomic<std::int64_t>::is_always_lock_free, "signal handlers need lock-free atomics");
char g_dir[512];
bool g_has_dir = false;
// Rank threads: a fault is delivered to the thread that caused it, so its own
// rank and step name it. initial-exec: reading it allocates nothing.
[[gnu::tls_model("initial-exec")]] thread_local int t_rank = -1;
[[gnu::tls_model("initial-exec")]] thread_local std::int64_t t_step = -1;
[[gnu::tls_model("initial-exec")]] thread_local bool t_step_done = false;

constexpr int kFatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
struct sigaction g_previous[NSIG];

std::int64_t now_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// A line built without allocating; what does not fit is cut.
class Line {
 public:
  Line& operator<<(const char* s) {
    while (*s != '\0' && n_ < sizeof buf_ - 1) buf_[n_++] = *s++;
    return *this;
  }
  Line& operator<<(std::int64_t v) {
    char digits[24];
    int k = 0;
    const bool negative = v < 0;
    auto u = negative ? 0 - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
    do digits[k++] = static_cast<char>('0' + u % 10);
    while ((u /= 10) != 0);
    if (negative) digits[k++] = '-';
    while (k > 0 && n_ < sizeof buf_ - 1) buf_[n_++] = digits[--k];
    return *this;
  }
  void write_out() {
    buf_[n_++] = '\n';
    for (std::size_t done = 0; done < n_;) {
      const ssize_t w = ::write(STDERR_FILENO, buf_ + done, n_ - done);
      if (w <= 0) return;
      done += static_cast<std::size_t>(w);
    }
  }

 private:
  char buf_[1024];
  std::size_t n_ = 0;
};

// "meshtrain: rank R <verb> SIGNAME in step S of N[ while waiting T s for rank P]; <checkpoint>".
void say(const char* verb, int signal) {
  const int errno_before = errno;
  Line line;
  const int rank = t_rank >= 0 ? t_rank : g_process_rank.load(std::memory_order_relaxed);
  line << "meshtrain: ";
  if (rank >= 0) line << "rank " << std::int64_t{rank} << " ";
  else line << "the process ";
  line << verb << signal_name(signal);
  const std::int64_t step = t_rank >= 0 ? t_step : g_step.load(std::memory_order_relaxed);
  const bool done = t_rank >= 0 ? t_step_done : g_step_done.load(std::memory_order_relaxed);
  if (step > 0) line << (done ? " after step " : " in step ") << step << " of " << g_steps.load(std::memory_order_relaxed);
  else if (step == 0) line << " before its first step";
  if (const int peer = g_waiting.load(std::memory_order_acquire); peer >= 0) {
    const std::int64_t ms = (now_ns() - g_wait_start_ns.load(std::memory_order_relaxed)) / 1000000;
    const std::int64_t frac = ms % 1000;
    line << " while waiting " << ms / 1000 << "." << (frac < 100 ? "0" : "") << (frac < 10 ? "0" : "") << frac
         << " s for rank " << std::int64_t{peer};
  }
  // Before its first step the rank may still be reading the checkpoint it resumes: say nothing of one.
  if (step >= 0) {
    const std::int64_t saved = g_saved.load(std::memory_order_relaxed);
    if (!g_has_dir) line << "; no --checkpoint was given, so nothing was saved";
    else if (saved == 0) line << "; no checkpoint was written to '" << g_dir << "' yet";
    else
      line << "; the last checkpoint in '" << g_dir << "' is of step " << saved
           << ": continue it with --resume (from step " << saved + 1 << ")";
  }
  line.write_out();
  errno = errno_before;
}

extern "C" void on_fatal_signal(int signal, siginfo_t* info, void*) {
  say("died of ", signal);
  sigaction(signal, &g_previous[signal], nullptr);
  // A fault re-runs its instruction when the handler returns and meets the
  // handler restored above; a signal that was sent (kill, raise, abort) must
  // be raised again. Blocked until this handler returns, it then runs that one.
  if (info == nullptr || info->si_code <= 0) raise(signal);
}

}  // namespace

void set_process_rank(int rank) { g_process_rank.store(rank, std::memory_order_relaxed); }

void set_thread_rank(int rank) { t_rank = rank; }

void set_step(std::int64_t step, std::int64_t steps, bool done) {
  t_step = step;
  t_step_done = done;
  g_steps.store(steps, std::memory_order_relaxed);
  g_step_done.store(done, std::memory_order_relaxed);
  g_step.store(step, std::memory_order_relaxed);
}

void set_checkpoint_dir(std::string_view dir) {
  g_has_dir = !dir.empty();
  const std::size_t n = std::min(dir.size(), sizeof g_dir - 1);
  dir.copy(g_dir, n);
  g_dir[n] = '\0';
}

void set_saved_step(std::int64_t step) { g_saved.store(step, std::memory_order_relaxed); }

void set_waiting_for(int peer) {
  if (peer >= 0 && g_waiting.load(std::memory_order_relaxed) < 0)
    g_wait_start_ns.store(now_ns(), std::memory_order_relaxed);
  g_waiting.store(peer, std::memory_order_release);
}

void announce_stops(bool on) { g_announce.store(on, std::memory_order_relaxed); }

void install_fatal_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const int signal : kFatal) {
      struct sigaction action {};
      action.sa_sigaction = on_fatal_signal;
      sigemptyset(&action.sa_mask);
      action.sa_flags = SA_SIGINFO;
      sigaction(signal, &action, &g_previous[signal]);
    }
  });
}

void announce_stop(int signal) {
  if (g_announce.load(std::memory_order_relaxed)) say("got ", signal);
}

const char* signal_name(int signal) {
  switch (signal) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return "a signal";
  }
}

}  // namespace meshtrain::last_words
