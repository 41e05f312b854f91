#include "engine/training/stop_request.h"

#include <csignal>

#include <atomic>
#include <mutex>

#include "core/last_words.h"

namespace meshtrain {

namespace {

std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");

extern "C" void on_stop_signal(int signal) {
  const bool first = stop_signal() == 0;
  request_stop(signal);
  // Under mpirun this SIGTERM may be the job's end (a peer died): say where this rank was, while it can.
  if (first) last_words::announce_stop(signal);
}

}  // namespace

void install_stop_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    // SA_RESTART: system calls of the running step carry on; SA_RESETHAND: a second signal kills.
    action.sa_flags = SA_RESTART | SA_RESETHAND;
    sigaction(SIGTERM, &action, nullptr);
    sigaction(SIGINT, &action, nullptr);
  });
}

int stop_signal() { return g_stop_signal.load(std::memory_order_relaxed); }

void request_stop(int signal) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, signal, std::memory_order_relaxed);
}

const char* stop_signal_name(int signal) { return last_words::signal_name(signal); }

}  // namespace meshtrain
