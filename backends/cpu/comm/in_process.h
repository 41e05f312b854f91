// Ranks as threads of one process: the "threads" communicator.
//
// One InProcessHub is shared by the N rank threads of a world; each thread owns
// one InProcessCommunicator made from it. Collectives meet in the hub: every
// member posts pointers to its buffers, and once all have arrived each member
// reads its peers' buffers directly (no staging copies) and works on its share
// of the result:
//   all_reduce     member k folds block k of every contribution in ascending
//                  group order and writes the result into every member's
//                  buffer, so each element is read G times and written G times
//                  in total, however large G is;
//   reduce_scatter member k folds block k of every input into its output;
//   all_gather     member k copies every input into its output;
//   broadcast      non-roots copy the root's buffer;
//   all_to_all     member k copies block k of every input into its output.
// A member returns only after every member has finished, because peers read
// and write its buffers until then.
//
// Point-to-point sends copy into a per-destination mailbox and return; a recv
// takes the oldest message of its (source, tag).
//
// Failure: the first error on any rank (a timeout, a misuse, a rank function
// that returned an error, a rank that returned while peers wait for it)
// poisons the hub; every waiting rank wakes at once and every later call on any
// communicator of the hub fails with that first error's text.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "backends/cpu/communicator.h"

namespace meshtrain {

class InProcessHub {
 public:
  InProcessHub(int world_size, CommOptions options = {});
  InProcessHub(const InProcessHub&) = delete;
  InProcessHub& operator=(const InProcessHub&) = delete;
  ~InProcessHub();

  int world_size() const { return world_; }
  const CommOptions& options() const { return options_; }

  // Records `error` as the hub's failure unless one is recorded already, and
  // wakes every waiting rank. Thread-safe.
  void poison(const Error& error);
  // The first recorded failure, if any. Thread-safe.
  std::optional<Error> failure() const;
  // Tells the hub that `rank` will issue no more calls (its thread returned),
  // so peers that wait for it fail at once rather than at the timeout.
  // Thread-safe.
  void mark_exited(int rank);

 private:
  friend class InProcessCommunicator;
  struct Call;
  struct GroupState;
  struct Mailbox;

  // The hub's state for g.id, created by its first user; fails if another
  // member list was used with the same id.
  Result<GroupState*> group_state(const Group& g, std::string_view op);
  bool poisoned() const { return poisoned_.load(std::memory_order_acquire); }
  // poison() without the wake-up: callable while holding a GroupState::mu
  // (failure_mu_ is a leaf lock), which poison() is not.
  void record_failure(const Error& error);
  bool exited(int rank) const { return exited_[static_cast<std::size_t>(rank)].load(); }
  // Locks and notifies every group and mailbox so that waiters re-check.
  void wake_all();

  const int world_;
  const CommOptions options_;

  std::atomic<bool> poisoned_{false};
  mutable std::mutex failure_mu_;  // guards failure_
  std::optional<Error> failure_;

  std::unique_ptr<std::atomic<bool>[]> exited_;  // by rank; set once, never cleared

  // Lock order: groups_mu_ before any GroupState::mu; failure_mu_ is taken
  // last and nothing is locked while holding it or a Mailbox::mu.
  std::mutex groups_mu_;  // guards the map groups_ (not the states it owns)
  std::map<int, std::unique_ptr<GroupState>> groups_;

  std::vector<std::unique_ptr<Mailbox>> mailboxes_;  // by destination rank; fixed size
};

class InProcessCommunicator final : public Communicator {
 public:
  // `rank` in [0, hub->world_size()); one communicator per rank.
  InProcessCommunicator(std::shared_ptr<InProcessHub> hub, int rank);

  int rank() const override { return rank_; }
  int world_size() const override { return hub_->world_size(); }
  std::string_view kind() const override { return "threads"; }

  #include "backends/cpu/communicator_overrides.inc"

 private:
  // Posts this rank's part of a collective, waits for the group, does this
  // member's share of the data movement, waits for the group to finish.
  Status collective(const Group& g, InProcessHub::Call& call);
  Result<InProcessHub::GroupState*> group_state(const Group& g, std::string_view op);
  Result<std::vector<const InProcessHub::Call*>> arrive(InProcessHub::GroupState& gs, std::size_t me,
                                                        InProcessHub::Call& call, const std::string& where,
                                                        std::uint64_t& seq);
  void depart(InProcessHub::GroupState& gs, std::uint64_t seq);
  static std::string posts_mismatch(const Group& g, const std::vector<const InProcessHub::Call*>& calls);
  static void move_share(const Group& g, const InProcessHub::Call& call,
                         const std::vector<const InProcessHub::Call*>& calls, std::size_t k);
  // With gs.mu held.
  void withdraw_locked(InProcessHub::GroupState& gs, std::size_t member);
  // Poisons the hub with `e` and returns it.
  Error fail(Error e);
  // Fails at once when the hub is poisoned.
  Status check_alive(std::string_view what);

  std::shared_ptr<InProcessHub> hub_;
  const int rank_;
  // Group states already looked up, so the hub's map is locked once per group.
  std::unordered_map<int, InProcessHub::GroupState*> groups_;
};

// Runs `body(rank, comm)` for ranks 0..world-1, each on its own thread with its
// own InProcessCommunicator of one fresh hub, and joins them all. A rank whose
// body returns an error (or throws) poisons the hub, so the others fail fast
// instead of waiting for it; a body that returns early while others wait for it
// makes them fail at once. Returns the first error recorded (the root cause,
// not the "another rank failed" echoes), or ok if every body succeeded.
Status run_ranks(int world, const std::function<Status(int rank, Communicator& comm)>& body,
                 CommOptions options = {});

}  // namespace meshtrain
