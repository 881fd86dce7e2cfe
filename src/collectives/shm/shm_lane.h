// The direct lane: a small allreduce, broadcast or allgather that every member of one host calls
// at about the same time runs at once, without the coordinator, over a shared-memory board.
//
// Members meet at positions 1, 2, 3, ... of the lane, each taking them in order. At a position
// every member posts its call (the collective, count, dtype, op, scale factors, root, and the
// caller's signature: an opaque byte string, the name and shape) and its data (an allreduce's
// prescaled input; a broadcast's on the root only, which may fill every member's room), then
// counts itself in on the position's decision word. The member that brings the count to `size`
// compares the calls: equal, the position commits and every member makes its result from the
// posted data (an allreduce reduces all inputs in rank order, the association of the
// shared-memory communicator, so the result has the same bits as through the engine); up to 56
// bytes of result the last member makes it into the decision word's cache line, where the others
// read it, and above that each member makes it itself. Unequal, it aborts. Whoever decides a
// position also writes the decision (and such a result) into each other member's mailbox, a
// line only its owner reads, where the others spin: the decider's compare-and-swap then does not
// contend with their reads, and the decision reaches each of them in one transfer. A member
// that waited a whole window (and its sleep) for the others aborts the position too. An aborted
// position is dead: whoever reaches it later skips it and posts at the next one, so members that
// fell out of step (one ran a call through the engine) find each other again at the next position.
//
// Where the members may read each other's memory (Options::pids), a large broadcast or
// allgather posts where its input is instead of the data, and the others copy it straight out
// of the owner's process after the commit; the owner returns once all of them have.
//
// A call that returns false changed no output; every member that posted at that position
// returns false too, and runs the call through the engine, where its name is negotiated as
// usual (mismatches are reported there). Members never wait longer than the window and its
// sleep, so a member that is busy elsewhere costs the others that, not a hang. A member that
// knows it will take the engine for a call declines it: it posts the call at its next position
// and aborts the position, so the others leave at once (and later ones on arrival) instead of
// waiting.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "collectives/shm/move_pacer.h"
#include "krug/types.h"

namespace krug::collectives::shm {

class Lane {
 public:
  struct Options {
    size_t max_bytes = 64 * 1024;  // payload of one call
    // How long a member spins for the others at a position (or for a slot to be free).
    std::chrono::nanoseconds window = std::chrono::microseconds(50);
    // How long it then sleeps for them, woken by the last one in: a partner whose core was
    // taken (by the host of a VM, another process) is usually on its way, and sleeping frees
    // this member's core without the engine's longer way around. 0: never sleeps.
    std::chrono::nanoseconds sleep{0};
    // Every member's pid, where each may read the others' memory (cross_memory.h); empty: none
    // may. Then a broadcast or allgather of at least `cross_memory_bytes` of result posts no
    // data: the others read the root's (every member's) input in place, one copy instead of
    // two, and its owner returns only once they all have.
    std::vector<pid_t> pids;
    size_t cross_memory_bytes = 32 * 1024;
    // The most result bytes of a call read in place (beyond it the engine's pipelined copies
    // are faster).
    size_t max_in_place_bytes = 8 << 20;
    // How long an owner waits for the others to finish reading its input in place (they are
    // copying it, with no wait of their own): reached only where one died. Then run() throws.
    std::chrono::nanoseconds stall = std::chrono::seconds(30);
  };
  // Signatures longer than this take the engine.
  static constexpr size_t kMaxSignature = 216;

  // Bytes of shared memory `size` members need; the memory must start zeroed.
  static size_t memory_bytes(int size, size_t max_bytes);
  // `memory`: memory_bytes(size, options.max_bytes) bytes, mapped by every member.
  Lane(int rank, int size, uint8_t* memory, const Options& options);
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  // The most bytes of one member's input in an allreduce: its room on the board.
  size_t max_bytes() const { return options_.max_bytes; }
  // The most of a broadcast: every member's room, since only the root posts; up to
  // max_in_place_bytes where it is read in place, which takes no room.
  size_t max_broadcast_bytes() const;
  // The most of one member's input in an allgather: its room; read in place, 1/size of
  // max_in_place_bytes.
  size_t max_allgather_bytes() const;
  // The window and the sleep of the calls from now on. `leave_for_busy`: a call leaves a
  // position at once, as if its window had passed, while another member says it is busy, and
  // takes the engine at once where a member is kRing positions behind.
  void set_wait(std::chrono::nanoseconds window, std::chrono::nanoseconds sleep,
                bool leave_for_busy = false) {
    options_.window = window;
    options_.sleep = sleep;
    leave_for_busy_ = leave_for_busy;
  }
  // This member has other work in flight that its calls wait behind (its engine's operations,
  // say): the others' calls made with leave_for_busy do not wait for it. Cheap when unchanged;
  // one thread at a time, any thread.
  void set_busy(bool busy) {
    if (busy == busy_) return;
    busy_ = busy;
    busy_word(rank_).store(busy ? 1 : 0, std::memory_order_release);
  }

  // What a member posts in its slot: the collective and the arguments the members compare
  // (besides the caller's signature). Made by the *_call functions below. Members compare the
  // whole call, so no signature can make one read past another's data.
  struct Call {
    uint64_t count;  // of one member's data
    double prescale;
    double postscale;
    uint16_t signature_length;
    uint16_t root;  // broadcast
    uint8_t kind;
    uint8_t dtype;
    uint8_t op;            // allreduce
    uint8_t element_size;  // of dtype: read on every call, where dtype_size() costs a call
  };
  // output = prescale * input, reduced over the members, times postscale; `op` is the kernel's
  // (an average is a sum with postscale / size).
  static Call allreduce_call(size_t count, DataType dtype, ReduceOp op, double prescale,
                             double postscale);
  // The root's input into every member's output (either may be the other).
  static Call broadcast_call(size_t count, DataType dtype, int root);
  // Every member's input in rank order into output (size x count elements).
  static Call allgather_call(size_t count, DataType dtype);

  // Meets the others at the next live position with `call` and makes this member's result in
  // `output`; false, output untouched, when the members did not all make it there within the
  // window or their calls differ. One thread at a time. `count`: elements of one member's data.
  bool run(const Call& call, std::span<const uint8_t> signature, const void* input, void* output);
  // Whether the last run() that returned false found another member's post of the same call at
  // its position: the members make their calls together, only one took the engine or came too
  // late, so the miss says nothing against using the lane.
  bool partner_left() const { return partner_left_; }
  // How the last run() waited for its decision: not at all (it came last, or too late), by
  // spinning within its window, or asleep after it.
  enum class Wait : uint8_t { kNone, kSpun, kSlept };
  Wait last_wait() const { return last_wait_; }
  // This member makes `call` through the engine: the others, waiting with it at this member's
  // next position or coming there later, leave at once. Never waits; does nothing where the
  // position's slots are still in use or another member is already gone to the engine with it.
  void decline(const Call& call, std::span<const uint8_t> signature);

  // The three collectives as run() with their *_call.

  bool allreduce(std::span<const uint8_t> signature, const void* input, void* output, size_t count,
                 DataType dtype, ReduceOp op, double prescale, double postscale);
  bool broadcast(std::span<const uint8_t> signature, const void* input, void* output, size_t count,
                 DataType dtype, int root);
  bool allgather(std::span<const uint8_t> signature, const void* input, void* output, size_t count,
                 DataType dtype);

  class Deadline;  // a call's window, read from the clock only once a wait spins

 private:
  // Whether `call` may take the lane at all (its data and signature fit).
  bool fits(const Call& call, std::span<const uint8_t> signature) const;
  // Whether `call`'s data fits: on the board, or read in place.
  bool data_fits(const Call& call) const;
  // A position this member may post at, and its decision word as then read.
  struct Live {
    uint64_t position = 0;
    uint64_t word = 0;
  };
  // The first live position from next_, dead ones passed; position 0 where the call must take
  // the engine: a slot still in use at the deadline, or a dead position where another member
  // posted this very call (it runs it through the engine).
  Live live_position(const Call& call, std::span<const uint8_t> signature, Deadline& deadline);
  // Writes `call` and `signature` into this member's slot at `position`.
  void post_call(uint64_t position, const Call& call, std::span<const uint8_t> signature);
  // Aborts `position` for everyone, unless it is decided already.
  void abort(uint64_t position);
  // Waits until every member has passed `position` (none of them reads its slots any more).
  bool all_passed(uint64_t position, Deadline& deadline);
  // Counts this member in at `live.position` (its slot written); returns the decision word
  // after. The last member in also makes a small result in the position's line before it
  // commits.
  uint64_t arrive(Live live, const Call& call, std::span<const uint8_t> signature);
  // The result of `call` from every member's data at `position` (before the postscale).
  void make_result(uint64_t position, const Call& call, uint8_t* out) const;
  size_t result_bytes(const Call& call) const;
  // Whether `member`'s slot at `position` holds `call` with `signature`.
  bool holds(int member, uint64_t position, const Call& call,
             std::span<const uint8_t> signature) const;
  // Whether every other member's slot holds this member's call.
  bool calls_agree(uint64_t position, const Call& call, std::span<const uint8_t> signature) const;
  // Whether another member completed its post of this call at `position`.
  bool posted_by_another(uint64_t position, const Call& call,
                         std::span<const uint8_t> signature) const;
  // `member`'s mailbox for `position`: the decision word another member announced to it there.
  std::atomic<uint64_t>& mailbox(int member, uint64_t position) const;
  // The small result beside it, with a commit.
  uint8_t* mailbox_result(int member, uint64_t position) const;
  // Writes the word `decided` (and `bytes` of the position's result) into every other member's
  // mailbox for its position.
  void announce(uint64_t decided, const uint8_t* result, size_t bytes) const;
  // The word of `position` as this member's mailbox tells it; `w`, the word as last seen, while
  // nothing is announced.
  uint64_t announced(uint64_t position, uint64_t w);
  // Bytes of `call`'s result that the last member makes in the position's line; 0: none.
  size_t inline_bytes(const Call& call) const;
  // Spins for the decision until the deadline, sleeps for it up to options_.sleep more, then
  // aborts the position if it is still open. Where another member last ran on this member's
  // core, it sleeps the window too (spinning would only keep that member off the core), unless
  // one of them moves to a free core (move_off_shared_core).
  uint64_t decision(uint64_t position, uint64_t word, Deadline& deadline);
  // Marks the open decision word `w` (a member sleeps on it) and sleeps until the word changes
  // or `until`; returns at once where the word is no longer `w`.
  static void sleep_on(std::atomic<uint64_t>& decision_word, uint64_t w,
                       std::chrono::steady_clock::time_point until);
  void pass(uint64_t position);
  // pass(), where others may sleep until it: the owners of a call read in place
  // (wait_for_readers), the readers of a broadcast on the board (read_board).
  void pass_waking_owners(uint64_t position);

  std::atomic<uint64_t>& word(uint64_t position) const;
  // Whether `call`'s data is read in place (cross-memory) rather than posted on the board.
  bool reads_in_place(const Call& call) const;
  // Where `member` said its input of the call at `position` is (read in place).
  std::atomic<uint64_t>& input_address(int member, uint64_t position) const;
  // The result of a call read in place, then this member's pass; throws where a read failed.
  void read_in_place(uint64_t position, const Call& call, uint8_t* out);
  // What the others read of this member's input in place: `input`, or a copy of it in spare_
  // where this member's own result would overwrite it meanwhile (an allgather into itself).
  const void* readable_input(const Call& call, const void* input, const void* output);
  // Waits until every other member has passed `position`: none reads this member's input any
  // more. Throws after options_.stall.
  void wait_for_readers(uint64_t position);
  // A broadcast on the board: its root writes its own room before the commit (start_board),
  // the rest after it (finish_board) in parts the readers copy as each is written
  // (read_board). Before the commit the others may have written their rooms for other calls.
  void start_board(uint64_t position, const uint8_t* input, size_t bytes);
  void finish_board(uint64_t position, const uint8_t* input, size_t bytes);
  // Copies the root's data into `out`, then passes; throws after options_.stall.
  void read_board(uint64_t position, int root, uint8_t* out, size_t bytes);
  // Copies `bytes` of `root`'s broadcast from `offset` on: onto the board from `from`, or off
  // it into `to` (the other null).
  void copy_board(uint64_t position, int root, size_t offset, uint8_t* to, const uint8_t* from,
                  size_t bytes) const;
  // The error of a wait for `member` to `what` that lasted options_.stall.
  Error stalled_on(int member, std::string_view what) const;
  // How many bytes of its broadcast `root` has written on the board at `position`.
  std::atomic<uint64_t>& board_written(int root, uint64_t position) const;
  // Waits until `member` has passed `position`: spins until `window` where `spin`, then sleeps
  // until that pass wakes this member. False at `stall_at`.
  bool await_pass(int member, uint64_t position, bool spin, Deadline& window,
                  std::chrono::steady_clock::time_point stall_at);
  uint8_t* member_line(int member, size_t line) const;
  std::atomic<uint64_t>& passed(int member) const;
  // The last position where `member` completed its post (its slot readable from then on, until
  // every member has passed the position).
  std::atomic<uint64_t>& posted(int member) const;
  // Owners asleep until `member` passes a position (they wait to have their input read).
  std::atomic<uint32_t>& sleepers(int member) const;
  // The core `member` last posted from, plus one (0: not known).
  std::atomic<uint32_t>& core(int member) const;
  // Whether a member other than this one, `first` or later in rank order, last posted from
  // `core_plus_one` (a core plus one, as core()).
  bool member_on_core(uint32_t core_plus_one, int first) const;
  bool another_on_this_core() const;
  // set_busy() of `member`, in its rarely written line.
  std::atomic<uint32_t>& busy_word(int member) const;
  // Whether a member other than this one says it is busy.
  bool another_busy() const;
  // Where another member shares this member's core and this one is the last of them in rank
  // order, moves this thread to a core no member runs on; whether it moved. The scheduler puts
  // a woken thread beside its waker, so members that wake each other can stay on one core
  // while another is idle, each call then costing both a switch of the core.
  bool move_off_shared_core();
  uint8_t* inline_result(uint64_t position) const;
  uint8_t* area(uint64_t position) const;
  // `member`'s call and signature at `position`.
  uint8_t* slot(int member, uint64_t position) const;
  // Where `member` posts its data at `position`: its own room, max_bytes() rounded up to a
  // cache line, after the room of the members before it.
  uint8_t* data(int member, uint64_t position) const;
  // Whether `call` is a broadcast larger than a room: its root posts it across the board,
  // from its own room on.
  bool fills_board(const Call& call) const;

  int rank_;
  int size_;
  uint8_t* memory_;
  Options options_;
  size_t data_stride_;       // max_bytes, rounded up to a cache line
  uint64_t next_ = 1;        // the next position this member takes
  uint64_t all_passed_ = 0;  // every member has passed this position (as last seen)
  bool partner_left_ = false;
  bool result_in_mailbox_ = false;  // the last decision came with its result in the mailbox
  Wait last_wait_ = Wait::kNone;
  uint32_t core_ = 0;  // as core(rank_)
  bool busy_ = false;  // as busy_word(rank_)
  bool leave_for_busy_ = false;
  MovePacer move_pacer_;        // move_off_shared_core()
  std::vector<uint8_t> spare_;  // readable_input()
};

}  // namespace krug::collectives::shm
