// A graceful stop on SIGTERM and SIGINT: the signals a scheduler (Slurm,
// Kubernetes) sends before it preempts a job, and a terminal's Ctrl-C.
//
// The handler records the signal (an atomic flag) and, for a rank that is an
// MPI process, writes one line saying where the rank was (core/last_words.h:
// mpirun ends a job whose process died with SIGTERM, and this line is then
// all the survivors can say). The training loop polls it after each step; the ranks agree
// to stop (one tiny all-reduce, so they all stop after the same step), write a
// checkpoint if one is configured and return an Error saying so; main then
// exits with 128 + the signal's number, as a shell reports a signal. The
// handler is installed with SA_RESETHAND: a second signal is not caught and
// ends the process at once, as a user pressing Ctrl-C twice expects.
#pragma once

namespace meshtrain {

// Installs the handlers for SIGTERM and SIGINT; idempotent.
void install_stop_handlers();
// 0 until a stop was requested; then the signal's number.
int stop_signal();
// Records a stop as if `signal` had arrived (tests; the handler calls it).
void request_stop(int signal);
// "SIGTERM", "SIGINT", or "a signal".
const char* stop_signal_name(int signal);

}  // namespace meshtrain
