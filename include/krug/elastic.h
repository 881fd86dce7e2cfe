// Elastic training with the framework-free C++ API (docs/elastic.md).
//
// Started by `krugrun --min-np MIN --max-np MAX --host-discovery-script SCRIPT ...`, workers
// come and go while the job runs. A worker keeps its training state in a krug::elastic::State,
// commits it at consistent points (every rank at the same step), and runs its training
// function through krug::elastic::run(): when a peer fails, every survivor rolls back to the
// last commit, re-initializes with a new rank layout and continues; when hosts are added, the
// new workers receive the committed state from rank 0 before they train.
//
//   struct MyState : krug::elastic::State { ... save / restore / sync ... };
//   krug::init();
//   MyState state;
//   krug::elastic::run(state, [&] { while (state.step < steps) { train_step(); state.commit(); }
//   });
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "krug/types.h"

namespace krug::elastic {

// Raised by State::commit() / check_host_updates() on every rank at the same step when the
// driver changed the set of hosts: the job re-forms with the new hosts. `skip_sync`: every
// change was a removal, so the survivors' states agree and need no broadcast.
class HostsUpdatedInterrupt : public Error {
 public:
  explicit HostsUpdatedInterrupt(bool skip_sync)
      : Error("the set of hosts changed; re-forming the job"), skip_sync_(skip_sync) {}
  bool skip_sync() const { return skip_sync_; }

 private:
  bool skip_sync_;
};

// Raised by init() in elastic mode when the driver took this worker out of the job (its host
// left the discovery output, was blacklisted, or was evicted as a straggler). run() returns
// normally in that case; the process should exit with status 0.
class WorkerRemoved : public Error {
 public:
  using Error::Error;
};

// True when this process was started by krugrun's elastic driver (KRUG_ELASTIC=1).
bool enabled();

// The rendezvous round the current init() joined (0, 1, ...; always 0 outside elastic mode)
// and whether workers without state joined in it (then every rank must sync its state).
struct RoundInfo {
  int64_t round = 0;
  bool has_new_workers = false;
};
// Throws krug::Error when krug is not initialized.
RoundInfo round_info();

// Asks the driver (one round trip to krugrun; rank-local, not collective) whether the set of
// hosts changed since this round began, and whether every change was a removal. Always
// {false, false} outside elastic mode.
struct HostUpdate {
  bool changed = false;
  bool only_removed = false;
};
HostUpdate host_update();

// Training state that survives failures: save() copies it aside, restore() brings the copy
// back, sync() makes every rank's state rank 0's (a collective). commit() saves and then checks
// for host updates (collectively: call it on every rank at the same step).
class State {
 public:
  virtual ~State() = default;
  virtual void save() = 0;
  virtual void restore() = 0;
  virtual void sync() = 0;

  void commit();
  // Collective: rank 0 asks the driver and broadcasts the answer, so every rank throws
  // HostsUpdatedInterrupt at the same step or none does.
  void check_host_updates();
  // Called after every reset (a new round), e.g. to rescale the learning rate by size().
  void register_reset_callback(std::function<void()> callback);
  void on_reset();
  // Commits so far, rolled back with the state (logs say which commit a rollback returns to).
  int64_t commits() const { return commits_; }

 protected:
  // Subclasses call these from save() / restore() so the commit count follows the state.
  void save_commit_count() { saved_commits_ = commits_; }
  void restore_commit_count() { commits_ = saved_commits_; }

 private:
  std::vector<std::function<void()>> reset_callbacks_;
  int64_t commits_ = 0;
  int64_t saved_commits_ = 0;
};

// Runs `train` until it returns. On krug::Error (a failed peer, a timeout) the state is
// restored to its last commit; on HostsUpdatedInterrupt it is kept; either way krug is
// shut down and initialized again (a new round, new ranks), the state is synced from rank 0
// and `train` is called again. Returns false when the driver removed this worker (WorkerRemoved)
// and true when `train` returned. Outside elastic mode, errors propagate as usual.
bool run(State& state, const std::function<void()>& train);

}  // namespace krug::elastic
