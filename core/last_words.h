// A rank's last words: one line, written by a signal handler, saying which
// rank a signal reached, in which step, what the last checkpoint is and
// which peer the rank was waiting for (issue 31). Without it a rank that
// dies under mpirun leaves only Open MPI's "exited on signal 11" (no step,
// no checkpoint), and the survivors, which mpirun ends with SIGTERM then
// SIGKILL a second later, say nothing at all.
//
// The trainer and the MPI communicator record where they are as they go;
// the handlers only read it. Nothing a signal handler may call allocates or
// locks, so the record is lock-free atomics plus one buffer written before
// the handlers are installed, and the line is made by hand and written with
// write(2).
//
//   fatal signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT: what a crash, an
//   abort or an uncaught exception's std::terminate ends in):
//     "meshtrain: rank 1 died of SIGSEGV in step 3 of 6; the last checkpoint
//      in 'ck' is of step 2: continue it with --resume (from step 3)"
//   ("after step 3" once the step is trained and recorded: its metrics line
//   is written, its checkpoint too when one was due), then the handler that was there before (Open MPI's backtrace) or the
//   default action runs, so the exit status still tells the signal;
//   a stop (SIGTERM, SIGINT) of a rank that is an MPI process (announce_stops):
//     "meshtrain: rank 0 got SIGTERM in step 3 of 6 while waiting 1.002 s for
//      rank 1; the last checkpoint ..."
//   which, when mpirun is ending the job because a peer died (even of
//   SIGKILL, which nothing can catch), names the peer the survivor waited for.
#pragma once

#include <cstdint>
#include <string_view>

namespace meshtrain::last_words {

// This process is one rank (MPI): every thread speaks for it.
void set_process_rank(int rank);
// The calling thread is rank `rank` (rank threads): a crash on it names it.
void set_thread_rank(int rank);
// The step the calling rank runs, of `steps`; 0: before its first step.
// `done`: the step is trained and recorded, the rank is past it (its stop vote).
void set_step(std::int64_t step, std::int64_t steps, bool done = false);
// The run's --checkpoint directory (empty: none); call before install_fatal_handlers.
void set_checkpoint_dir(std::string_view dir);
// The step of the checkpoint on disk; 0: none yet.
void set_saved_step(std::int64_t step);
// The peer (global rank) the process is waiting for in a communication; -1:
// none. The wait's start is kept from the first call with a peer.
void set_waiting_for(int peer);
// Stops are announced (the SIGTERM line above): for ranks that are processes.
void announce_stops(bool on);

// Installs the fatal-signal handlers, once; each passes the signal on to the
// handler it replaced. Under MPI call it after MPI_Init, so that Open MPI's own
// handler (its backtrace) is the one passed on to rather than one that replaces ours.
void install_fatal_handlers();
// From a stop handler: writes the stop line if announce_stops is on.
// Async-signal-safe.
void announce_stop(int signal);

// "SIGSEGV", "SIGKILL", ...: the name of a signal this file handles or a
// fault injects; "a signal" for any other. Async-signal-safe.
const char* signal_name(int signal);

}  // namespace meshtrain::last_words
