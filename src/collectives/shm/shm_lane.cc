#include "collectives/shm/shm_lane.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>

#include "collectives/shm/cross_memory.h"
#include "collectives/shm/rank_order.h"
#include "collectives/shm/shm_sync.h"
#include "reduce/copy.h"
#include "reduce/reduce.h"

namespace krug::collectives::shm {

namespace {

using Clock = std::chrono::steady_clock;

// Positions in use at once: a member may run this many ahead of the slowest. Each costs every
// member a slot of max_bytes in /dev/shm (Docker's is 64 MiB by default).
constexpr uint64_t kRing = 4;
constexpr size_t kLine = 64;
// Each member's lines: what it passed and posted last (written every call, read by the others
// now and then) and how many owners sleep until it passes; the core it ran on and whether it is
// busy (read by the others every call, written rarely); its mailbox, a line for each position of
// the ring (written by the others, read by it alone).
constexpr size_t kMailbox = 2;  // the first mailbox line
constexpr size_t kMemberLines = kMailbox + kRing;
// An owner asleep for its readers wakes at least this often to see whether its stall is over.
constexpr auto kReaderSleep = std::chrono::milliseconds(50);
// A slot: the call (Lane::Call and the caller's signature), then the data from kHeader.
constexpr size_t kHeader = 256;
// A position's line holds its decision word and, for a call of up to this many bytes, the result
// that the last member in reduced: the others read it in the line they watch for the decision,
// instead of fetching every member's data after it.
constexpr size_t kInlineBytes = kLine - sizeof(uint64_t);
// The last word of a member's header: where its input is, for a call read in place.
constexpr size_t kAddressOffset = kHeader - sizeof(uint64_t);
// A root fills the board after the commit in parts of this size, each readable once written.
constexpr size_t kBoardPart = 64 * 1024;
static_assert(sizeof(Lane::Call) + Lane::kMaxSignature <= kAddressOffset);
enum class Kind : uint8_t { kAllreduce, kBroadcast, kAllgather };

// A position's decision word: the position, its state, whether a member sleeps on it (whoever
// decides the position must wake it) and how many members are in.
enum State : uint64_t { kOpen = 0, kCommit = 1, kAbort = 2 };
constexpr int kStateShift = 14;
constexpr int kCountBits = 13;
constexpr uint64_t kCountMask = (uint64_t{1} << kCountBits) - 1;
constexpr uint64_t kSleeper = uint64_t{1} << kCountBits;
constexpr uint64_t make_word(uint64_t position, State state, uint64_t count) {
  return position << 16 | static_cast<uint64_t>(state) << kStateShift | count;
}
constexpr uint64_t position_of(uint64_t word) {
  return word >> 16;
}
constexpr State state_of(uint64_t word) {
  return static_cast<State>((word >> kStateShift) & 3);
}
constexpr uint64_t count_of(uint64_t word) {
  return word & kCountMask;
}

Lane::Call call_of(Kind kind, size_t count, DataType dtype) {
  return Lane::Call{.count = count,
                    .prescale = 1.0,
                    .postscale = 1.0,
                    .signature_length = 0,
                    .root = 0,
                    .kind = static_cast<uint8_t>(kind),
                    .dtype = static_cast<uint8_t>(dtype),
                    .op = 0,
                    .element_size = static_cast<uint8_t>(dtype_size(dtype))};
}

// The data of one member.
size_t data_bytes(const Lane::Call& call) {
  return call.count * call.element_size;
}

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

size_t data_stride_for(size_t max_bytes) {
  return round_up(max_bytes, kLine);
}

void pause() {
  __builtin_ia32_pause();
}

// A futex watches 32 bits: the decision word's low half, which holds its state, count, sleeper
// mark and the position's low bits, so any change of the word shows there.
uint32_t* low_half(std::atomic<uint64_t>& decision_word) {
  static_assert(std::endian::native == std::endian::little);
  return reinterpret_cast<uint32_t*>(&decision_word);
}

void wake_sleepers(std::atomic<uint64_t>& decision_word) {
  futex_wake_all(low_half(decision_word));
}

}  // namespace

// The end of a call's window, read from the clock only once a wait has spun a while: most
// calls find their partners at once, and a clock read costs as much as the rest of such a call.
class Lane::Deadline {
 public:
  explicit Deadline(std::chrono::nanoseconds window) : window_(window) {}
  bool passed() {
    const auto now = Clock::now();
    if (at_ == Clock::time_point{}) at_ = now + window_;
    return now >= at_;
  }

 private:
  std::chrono::nanoseconds window_;
  Clock::time_point at_{};
};

namespace {

// Spins until `done()`; false once the deadline has passed (looked at every 64 turns).
template <typename Done>
bool spin_until(Done&& done, Lane::Deadline& deadline) {
  for (unsigned turn = 1;; ++turn) {
    if (done()) return true;
    if (turn % 64 == 0 && deadline.passed()) return done();
    pause();
  }
}

// Moves the calling thread to core `cpu`, then lets it run on the cores `allowed` (its own, `cpu`
// among them) again: the scheduler leaves it where it is until it has a reason to move it.
bool move_to_core(int cpu, const cpu_set_t& allowed) {
  cpu_set_t only;
  CPU_ZERO(&only);
  CPU_SET(cpu, &only);
  if (::sched_setaffinity(0, sizeof(only), &only) != 0) return false;
  ::sched_setaffinity(0, sizeof(allowed), &allowed);
  return true;
}

}  // namespace

size_t Lane::memory_bytes(int size, size_t max_bytes) {
  return kRing * kLine + static_cast<size_t>(size) * kMemberLines * kLine +
         static_cast<size_t>(size) * kRing * (kHeader + data_stride_for(max_bytes));
}

Lane::Lane(int rank, int size, uint8_t* memory, const Options& options)
    : rank_(rank),
      size_(size),
      memory_(memory),
      options_(options),
      data_stride_(data_stride_for(options.max_bytes)) {
  if (size < 2 || static_cast<uint64_t>(size) > kCountMask || rank < 0 || rank >= size)
    throw Error(
        fmt::format("direct lane: rank {} of {} members (2 to {})", rank, size, kCountMask));
  static_assert(std::atomic<uint64_t>::is_always_lock_free);
}

std::atomic<uint64_t>& Lane::word(uint64_t position) const {
  return *reinterpret_cast<std::atomic<uint64_t>*>(memory_ + (position % kRing) * kLine);
}

uint8_t* Lane::member_line(int member, size_t line) const {
  return memory_ + kRing * kLine + (static_cast<size_t>(member) * kMemberLines + line) * kLine;
}

std::atomic<uint32_t>& Lane::sleepers(int member) const {
  return *reinterpret_cast<std::atomic<uint32_t>*>(member_line(member, 0) + 2 * sizeof(uint64_t));
}

std::atomic<uint64_t>& Lane::posted(int member) const {
  return *reinterpret_cast<std::atomic<uint64_t>*>(member_line(member, 0) + sizeof(uint64_t));
}

std::atomic<uint64_t>& Lane::mailbox(int member, uint64_t position) const {
  return *reinterpret_cast<std::atomic<uint64_t>*>(
      member_line(member, kMailbox + position % kRing));
}

uint8_t* Lane::mailbox_result(int member, uint64_t position) const {
  return member_line(member, kMailbox + position % kRing) + sizeof(uint64_t);
}

void Lane::announce(uint64_t decided, const uint8_t* result, size_t bytes) const {
  // A line per position of the ring: a decider that is slow to announce (its thread preempted
  // after the compare-and-swap) cannot overwrite the next position's announcement, and it
  // announces before it passes the position, so before anyone reuses the line.
  const uint64_t position = position_of(decided);
  for (int m = 0; m < size_; ++m) {
    if (m == rank_) continue;
    if (bytes > 0) std::memcpy(mailbox_result(m, position), result, bytes);
    mailbox(m, position).store(decided, std::memory_order_release);
  }
}

uint64_t Lane::announced(uint64_t position, uint64_t w) {
  const uint64_t m = mailbox(rank_, position).load(std::memory_order_acquire);
  if (position_of(m) != position) return w;  // kRing positions ago, or nothing yet
  result_in_mailbox_ = true;
  return m;
}

size_t Lane::inline_bytes(const Call& call) const {
  const size_t bytes = result_bytes(call);
  return bytes <= kInlineBytes && !fills_board(call) ? bytes : 0;
}

std::atomic<uint32_t>& Lane::core(int member) const {
  return *reinterpret_cast<std::atomic<uint32_t>*>(member_line(member, 1));
}

bool Lane::move_off_shared_core() {
  // Of the members on this core, the last in rank order moves: they must not all move at once.
  if (member_on_core(core_, rank_ + 1)) return false;
  if (!move_pacer_.may_try(Clock::now())) return false;
  cpu_set_t allowed;
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return false;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed) || member_on_core(static_cast<uint32_t>(cpu + 1), 0) ||
        !move_to_core(cpu, allowed))
      continue;
    core_ = static_cast<uint32_t>(cpu + 1);
    core(rank_).store(core_, std::memory_order_relaxed);
    return true;
  }
  return false;
}

std::atomic<uint32_t>& Lane::busy_word(int member) const {
  return *reinterpret_cast<std::atomic<uint32_t>*>(member_line(member, 1) + sizeof(uint64_t));
}

bool Lane::another_busy() const {
  for (int m = 0; m < size_; ++m)
    if (m != rank_ && busy_word(m).load(std::memory_order_acquire) != 0) return true;
  return false;
}

bool Lane::member_on_core(uint32_t core_plus_one, int first) const {
  for (int m = first; m < size_; ++m)
    if (m != rank_ && core(m).load(std::memory_order_relaxed) == core_plus_one) return true;
  return false;
}

bool Lane::another_on_this_core() const {
  return core_ != 0 && member_on_core(core_, 0);
}

std::atomic<uint64_t>& Lane::passed(int member) const {
  return *reinterpret_cast<std::atomic<uint64_t>*>(member_line(member, 0));
}

uint8_t* Lane::inline_result(uint64_t position) const {
  return memory_ + (position % kRing) * kLine + sizeof(uint64_t);
}

// A position's area: every member's header (its call and signature), then every member's data
// side by side, so that a broadcast root's data may take all of it.
uint8_t* Lane::area(uint64_t position) const {
  const size_t members = static_cast<size_t>(size_);
  return memory_ + kRing * kLine + members * kMemberLines * kLine +
         (position % kRing) * members * (kHeader + data_stride_);
}

uint8_t* Lane::slot(int member, uint64_t position) const {
  return area(position) + static_cast<size_t>(member) * kHeader;
}

uint8_t* Lane::data(int member, uint64_t position) const {
  return area(position) + static_cast<size_t>(size_) * kHeader +
         static_cast<size_t>(member) * data_stride_;
}

std::atomic<uint64_t>& Lane::input_address(int member, uint64_t position) const {
  return *reinterpret_cast<std::atomic<uint64_t>*>(slot(member, position) + kAddressOffset);
}

std::atomic<uint64_t>& Lane::board_written(int root, uint64_t position) const {
  // The slot's word for an input read in place: a broadcast on the board is not read in place.
  return input_address(root, position);
}

bool Lane::fills_board(const Call& call) const {
  return static_cast<Kind>(call.kind) == Kind::kBroadcast && !reads_in_place(call) &&
         data_bytes(call) > options_.max_bytes;
}

Lane::Call Lane::allreduce_call(size_t count, DataType dtype, ReduceOp op, double prescale,
                                double postscale) {
  Call call = call_of(Kind::kAllreduce, count, dtype);
  call.op = static_cast<uint8_t>(op);
  call.prescale = prescale;
  call.postscale = postscale;
  return call;
}

Lane::Call Lane::broadcast_call(size_t count, DataType dtype, int root) {
  Call call = call_of(Kind::kBroadcast, count, dtype);
  // A root out of range fits no member: fits() refuses it.
  call.root = root < 0 ? UINT16_MAX : static_cast<uint16_t>(std::min(root, int{UINT16_MAX}));
  return call;
}

Lane::Call Lane::allgather_call(size_t count, DataType dtype) {
  return call_of(Kind::kAllgather, count, dtype);
}

bool Lane::allreduce(std::span<const uint8_t> signature, const void* input, void* output,
                     size_t count, DataType dtype, ReduceOp op, double prescale, double postscale) {
  return run(allreduce_call(count, dtype, op, prescale, postscale), signature, input, output);
}

bool Lane::broadcast(std::span<const uint8_t> signature, const void* input, void* output,
                     size_t count, DataType dtype, int root) {
  return run(broadcast_call(count, dtype, root), signature, input, output);
}

bool Lane::allgather(std::span<const uint8_t> signature, const void* input, void* output,
                     size_t count, DataType dtype) {
  return run(allgather_call(count, dtype), signature, input, output);
}

bool Lane::fits(const Call& call, std::span<const uint8_t> signature) const {
  const bool root_ok = static_cast<Kind>(call.kind) != Kind::kBroadcast || call.root < size_;
  return root_ok && signature.size() <= kMaxSignature && call.count > 0 && data_fits(call);
}

bool Lane::data_fits(const Call& call) const {
  if (reads_in_place(call)) return result_bytes(call) <= options_.max_in_place_bytes;
  const size_t bytes = data_bytes(call);
  const bool broadcast = static_cast<Kind>(call.kind) == Kind::kBroadcast;
  return bytes <=
         (broadcast ? static_cast<size_t>(size_) * options_.max_bytes : options_.max_bytes);
}

size_t Lane::max_broadcast_bytes() const {
  const size_t board = static_cast<size_t>(size_) * options_.max_bytes;
  return options_.pids.empty() ? board : std::max(board, options_.max_in_place_bytes);
}

size_t Lane::max_allgather_bytes() const {
  const size_t in_place = options_.max_in_place_bytes / static_cast<size_t>(size_);
  return options_.pids.empty() ? options_.max_bytes : std::max(options_.max_bytes, in_place);
}

Lane::Live Lane::live_position(const Call& call, std::span<const uint8_t> signature,
                               Deadline& deadline) {
  // A position's slots were last used kRing positions ago: every member must be done with them.
  // A call that leaves for a busy member does not wait for one that is behind either: that
  // member has been making its calls through negotiation, and catches up when it next comes.
  Deadline no_wait(std::chrono::nanoseconds(0));
  Deadline& slots_free_by = leave_for_busy_ ? no_wait : deadline;
  for (uint64_t position = next_;; ++position) {
    if (position > kRing && !all_passed(position - kRing, slots_free_by)) return {};
    const uint64_t w = word(position).load(std::memory_order_acquire);
    if (position_of(w) != position || state_of(w) == kOpen) return {position, w};
    if (state_of(w) == kCommit)  // a commit counts every member: this one cannot have missed it
      throw Error(
          fmt::format("direct lane: position {} committed without rank {}", position, rank_));
    // A member that posted this very call at the dead position runs it through the engine now
    // (it cannot have finished it, nor posted again, without this member): waiting for it
    // here would only cost this member a window.
    const bool gone_to_engine = posted_by_another(position, call, signature);
    pass(position);
    if (gone_to_engine) {
      partner_left_ = true;
      return {};
    }
  }
}

void Lane::post_call(uint64_t position, const Call& call, std::span<const uint8_t> signature) {
  uint8_t* mine = slot(rank_, position);
  std::memcpy(mine, &call, sizeof(call));
  std::memcpy(mine + sizeof(call), signature.data(), signature.size());
}

bool Lane::run(const Call& asked, std::span<const uint8_t> signature, const void* input,
               void* output) {
  partner_left_ = false;
  last_wait_ = Wait::kNone;
  result_in_mailbox_ = false;
  if (!fits(asked, signature)) return false;
  Call call = asked;
  call.signature_length = static_cast<uint16_t>(signature.size());
  Deadline deadline(options_.window);
  const Live live = live_position(call, signature, deadline);
  const uint64_t position = live.position;
  if (position == 0) return false;
  post_call(position, call, signature);
  const auto kind = static_cast<Kind>(call.kind);
  const auto dtype = static_cast<DataType>(call.dtype);
  const size_t bytes = data_bytes(call);
  const bool in_place = reads_in_place(call);
  const bool owner = kind != Kind::kBroadcast || call.root == rank_;
  // Before the commit a member writes in its own room only: the others may have posted other
  // calls here, writing theirs. A root fills the board once the call is committed.
  const bool board = fills_board(call);
  if (in_place && owner)
    input_address(rank_, position)
        .store(reinterpret_cast<uint64_t>(readable_input(call, input, output)),
               std::memory_order_relaxed);
  else if (owner && board)
    start_board(position, static_cast<const uint8_t*>(input), bytes);
  else if (owner)
    reduce::copy(data(rank_, position), input, bytes);
  // Looked at here: a call of the kernel's own no-op costs a small call a good part of its work.
  if (kind == Kind::kAllreduce && call.prescale != 1.0)
    reduce::scale(dtype, data(rank_, position), call.count, call.prescale);
  posted(rank_).store(position, std::memory_order_release);
  // Read from the kernel's per-thread record (rseq): costs next to nothing.
  const auto core_now = static_cast<uint32_t>(sched_getcpu() + 1);
  if (core_now != core_) {  // written only when it changes: every member reads it every call
    core_ = core_now;
    core(rank_).store(core_, std::memory_order_relaxed);
  }

  const uint64_t w = decision(position, arrive(live, call, signature), deadline);
  if (state_of(w) != kCommit) {
    partner_left_ = posted_by_another(position, call, signature);
    pass(position);
    return false;
  }
  // Every member counted itself in after passing the position before: no need to look.
  all_passed_ = std::max(all_passed_, position - 1);
  auto* out = static_cast<uint8_t*>(output);
  if (in_place) {
    read_in_place(position, call, out);
    return true;
  }
  if (kind == Kind::kBroadcast && call.root == rank_) {
    if (board) finish_board(position, static_cast<const uint8_t*>(input), bytes);
    if (out != input) std::memcpy(out, input, bytes);  // the root's result: its input
    if (board) return true;
  } else if (board) {
    read_board(position, call.root, out, bytes);
    return true;
  } else if (const size_t small = inline_bytes(call); small > 0) {
    std::memcpy(out, result_in_mailbox_ ? mailbox_result(rank_, position) : inline_result(position),
                small);
  } else {
    make_result(position, call, out);
  }
  pass(position);
  if (kind == Kind::kAllreduce && call.postscale != 1.0)
    reduce::scale(dtype, output, call.count, call.postscale);
  return true;
}

void Lane::decline(const Call& asked, std::span<const uint8_t> signature) {
  partner_left_ = false;
  if (!fits(asked, signature)) return;  // the others cannot post it either
  Call call = asked;
  call.signature_length = static_cast<uint16_t>(signature.size());
  Deadline now(std::chrono::nanoseconds(0));
  const uint64_t position = live_position(call, signature, now).position;
  if (position == 0) return;
  // Posted before the abort: whoever sees the abort finds the call it may be waiting with.
  post_call(position, call, signature);
  posted(rank_).store(position, std::memory_order_release);
  abort(position);
  pass(position);
}

bool Lane::reads_in_place(const Call& call) const {
  const auto kind = static_cast<Kind>(call.kind);
  return !options_.pids.empty() && kind != Kind::kAllreduce &&
         result_bytes(call) >= options_.cross_memory_bytes;
}

const void* Lane::readable_input(const Call& call, const void* input, const void* output) {
  if (static_cast<Kind>(call.kind) != Kind::kAllgather) return input;
  // This member writes the others' rows into its output while they read its input: an input
  // inside those rows is read from a copy that stays put until they are done.
  const size_t bytes = data_bytes(call);
  const auto in = reinterpret_cast<uintptr_t>(input);
  const auto out = reinterpret_cast<uintptr_t>(output);
  const uintptr_t own = out + static_cast<uintptr_t>(rank_) * bytes;
  const bool clear = in + bytes <= out || in >= out + result_bytes(call) || in == own;
  if (clear) return input;
  spare_.assign(static_cast<const uint8_t*>(input), static_cast<const uint8_t*>(input) + bytes);
  return spare_.data();
}

void Lane::read_in_place(uint64_t position, const Call& call, uint8_t* out) {
  const size_t bytes = data_bytes(call);
  const bool gather = static_cast<Kind>(call.kind) == Kind::kAllgather;
  // This member's input as the others read it (its copy, where its rows would overwrite it).
  const auto* mine =
      reinterpret_cast<const void*>(input_address(rank_, position).load(std::memory_order_relaxed));
  std::string failed;
  int from = -1;
  for (int m = gather ? 0 : call.root; m < (gather ? size_ : call.root + 1) && failed.empty();
       ++m) {
    uint8_t* to = out + (gather ? static_cast<size_t>(m) * bytes : 0);
    if (m == rank_) {
      if (to != mine) reduce::move(to, mine, bytes);
      continue;
    }
    const auto remote = input_address(m, position).load(std::memory_order_relaxed);
    failed = read_process_memory(options_.pids[static_cast<size_t>(m)], to,
                                 reinterpret_cast<const void*>(remote), bytes);
    from = m;
  }
  pass_waking_owners(position);
  if (gather || call.root == rank_) wait_for_readers(position);
  if (!failed.empty())
    throw Error(
        fmt::format("direct lane: rank {} could not read rank {}'s {} bytes in place "
                    "({}); that rank most likely died: its own error, or its exit "
                    "status from the launcher, says why",
                    rank_, from, bytes, failed));
}

void Lane::wait_for_readers(uint64_t position) {
  Deadline window(options_.window);
  const auto stall_at = Clock::now() + options_.stall;
  // The readers are copying, so spin for them, unless one runs on this core.
  const bool spin = !another_on_this_core();
  for (int m = 0; m < size_; ++m)
    if (m != rank_ && !await_pass(m, position, spin, window, stall_at))
      throw stalled_on(m, "finish reading its input in place");
}

Error Lane::stalled_on(int member, std::string_view what) const {
  return Error(fmt::format(
      "direct lane: rank {} waited {} s for rank {} to {}; that rank died or stopped: its own "
      "error, or its exit status from the launcher, says why",
      rank_, std::chrono::duration_cast<std::chrono::seconds>(options_.stall).count(), member,
      what));
}

void Lane::copy_board(uint64_t position, int root, size_t offset, uint8_t* to, const uint8_t* from,
                      size_t bytes) const {
  // The data runs from the root's room on, around the board's end to the first member's room.
  const size_t board = static_cast<size_t>(size_) * data_stride_;
  uint8_t* base = data(0, position);
  for (size_t done = 0; done < bytes;) {
    const size_t at = (static_cast<size_t>(root) * data_stride_ + offset + done) % board;
    const size_t part = std::min(bytes - done, board - at);
    if (from != nullptr)
      reduce::copy(base + at, from + done, part);
    else
      reduce::copy(to + done, base + at, part);
    done += part;
  }
}

void Lane::start_board(uint64_t position, const uint8_t* input, size_t bytes) {
  const size_t own = std::min(bytes, options_.max_bytes);
  copy_board(position, rank_, 0, nullptr, input, own);
  board_written(rank_, position).store(own, std::memory_order_relaxed);  // posted() releases it
}

void Lane::finish_board(uint64_t position, const uint8_t* input, size_t bytes) {
  auto& written = board_written(rank_, position);
  for (size_t done = written.load(std::memory_order_relaxed); done < bytes;) {
    const size_t part = std::min(kBoardPart, bytes - done);
    copy_board(position, rank_, done, nullptr, input + done, part);
    done += part;
    written.store(done, std::memory_order_release);
  }
  pass_waking_owners(position);  // a reader that lost its core sleeps until this pass
}

void Lane::read_board(uint64_t position, int root, uint8_t* out, size_t bytes) {
  auto& written = board_written(root, position);
  Deadline window(options_.window);
  // The root is copying, so spin for its next part, unless it runs on this core.
  const bool spin = !another_on_this_core();
  size_t copied = 0;
  while (copied < bytes) {
    size_t ready = written.load(std::memory_order_acquire);
    auto more = [&] { return (ready = written.load(std::memory_order_acquire)) > copied; };
    if (ready == copied && !(spin && spin_until(more, window))) {
      if (!await_pass(root, position, false, window, Clock::now() + options_.stall))
        throw stalled_on(root, "post the broadcast they had agreed on");
      ready = bytes;  // the root passes once it has written everything
    }
    copy_board(position, root, copied, out + copied, nullptr, ready - copied);
    copied = ready;
  }
  pass(position);
}

bool Lane::await_pass(int member, uint64_t position, bool spin, Deadline& window,
                      Clock::time_point stall_at) {
  auto& counter = passed(member);
  auto done = [&] { return counter.load(std::memory_order_acquire) >= position; };
  if (spin && spin_until(done, window)) return true;
  // Past the window the member has lost its core: sleep until its pass wakes this one.
  sleepers(member).fetch_add(1, std::memory_order_seq_cst);
  bool arrived = false;
  for (;;) {
    const uint64_t seen = counter.load(std::memory_order_seq_cst);
    arrived = seen >= position;
    const auto now = Clock::now();
    if (arrived || now >= stall_at) break;
    futex_wait(low_half(counter), static_cast<uint32_t>(seen),
               std::min<std::chrono::nanoseconds>(kReaderSleep, stall_at - now));
  }
  sleepers(member).fetch_sub(1, std::memory_order_seq_cst);
  return arrived;
}

void Lane::abort(uint64_t position) {
  auto& decision_word = word(position);
  uint64_t w = decision_word.load(std::memory_order_acquire);
  for (;;) {
    if (position_of(w) == position && state_of(w) != kOpen) return;
    // A word of an earlier position: nobody has come here yet.
    const bool here = position_of(w) == position;
    const uint64_t in = here ? count_of(w) : 0;
    const uint64_t aborted = make_word(position, kAbort, in);
    if (decision_word.compare_exchange_weak(w, aborted, std::memory_order_acq_rel,
                                            std::memory_order_acquire)) {
      if (here && (w & kSleeper)) wake_sleepers(decision_word);
      if (in > 0) announce(aborted, nullptr, 0);  // members wait here
      return;
    }
  }
}

bool Lane::all_passed(uint64_t position, Deadline& deadline) {
  if (all_passed_ >= position) return true;
  uint64_t least = UINT64_MAX;
  for (int m = 0; m < size_; ++m) {
    if (m == rank_) continue;
    auto& counter = passed(m);
    if (!spin_until([&] { return counter.load(std::memory_order_acquire) >= position; }, deadline))
      return false;
    least = std::min(least, counter.load(std::memory_order_acquire));
  }
  all_passed_ = std::min(least, next_ - 1);
  return true;
}

size_t Lane::result_bytes(const Call& call) const {
  const size_t bytes = data_bytes(call);
  return static_cast<Kind>(call.kind) == Kind::kAllgather ? bytes * static_cast<size_t>(size_)
                                                          : bytes;
}

void Lane::make_result(uint64_t position, const Call& call, uint8_t* out) const {
  const auto dtype = static_cast<DataType>(call.dtype);
  const size_t bytes = data_bytes(call);
  switch (static_cast<Kind>(call.kind)) {
    case Kind::kAllreduce:
      reduce_in_rank_order(dtype, static_cast<ReduceOp>(call.op), out, size_, call.count,
                           [&](int m) { return data(m, position); });
      break;
    case Kind::kBroadcast:
      reduce::copy(out, data(call.root, position), bytes);
      break;
    case Kind::kAllgather:
      for (int m = 0; m < size_; ++m)
        reduce::copy(out + static_cast<size_t>(m) * bytes, data(m, position), bytes);
      break;
  }
}

uint64_t Lane::arrive(Live live, const Call& call, std::span<const uint8_t> signature) {
  const uint64_t position = live.position;
  auto& decision_word = word(position);
  // The word as live_position saw it, not loaded again: where another member has counted itself
  // in since, the compare-and-swap fails and fetches the line once (a load then a swap would
  // move it twice).
  uint64_t w = live.word;
  for (;;) {
    if (position_of(w) == position && state_of(w) != kOpen) return w;  // aborted meanwhile
    // A word of an earlier position: this member is the first here.
    const bool here = position_of(w) == position;
    const uint64_t in = here ? count_of(w) : 0;
    const uint64_t sleeper = here ? w & kSleeper : 0;
    uint64_t next = make_word(position, kOpen, in + 1) | sleeper;
    // The last one in sees every other member's slot (each wrote it before counting itself in).
    const bool last = in + 1 == static_cast<uint64_t>(size_);
    size_t result = 0;  // bytes of the small result the last one in makes, with a commit
    if (last) {
      const bool agree = calls_agree(position, call, signature);
      result = agree ? inline_bytes(call) : 0;
      if (result > 0) make_result(position, call, inline_result(position));
      next = make_word(position, agree ? kCommit : kAbort, in + 1);
    }
    if (decision_word.compare_exchange_weak(w, next, std::memory_order_acq_rel,
                                            std::memory_order_acquire)) {
      if (last && sleeper) wake_sleepers(decision_word);
      if (last) announce(next, inline_result(position), result);
      return next;
    }
  }
}

bool Lane::holds(int member, uint64_t position, const Call& call,
                 std::span<const uint8_t> signature) const {
  const uint8_t* theirs = slot(member, position);
  return std::memcmp(theirs, &call, sizeof(call)) == 0 &&
         std::memcmp(theirs + sizeof(call), signature.data(), signature.size()) == 0;
}

bool Lane::calls_agree(uint64_t position, const Call& call,
                       std::span<const uint8_t> signature) const {
  for (int m = 0; m < size_; ++m)
    if (m != rank_ && !holds(m, position, call, signature)) return false;
  return true;
}

bool Lane::posted_by_another(uint64_t position, const Call& call,
                             std::span<const uint8_t> signature) const {
  for (int m = 0; m < size_; ++m)
    if (m != rank_ && posted(m).load(std::memory_order_acquire) == position &&
        holds(m, position, call, signature))
      return true;
  return false;
}

uint64_t Lane::decision(uint64_t position, uint64_t w, Deadline& deadline) {
  auto& decision_word = word(position);
  if (state_of(w) != kOpen) return w;  // came last: no need to read where the others ran
  // The scheduler put another member on this core (a busy host): while this one spins, that
  // one cannot run, so each call would cost a window.
  const bool spin = !another_on_this_core() || move_off_shared_core();
  const auto sleep = spin ? options_.sleep : options_.window + options_.sleep;
  std::optional<Clock::time_point> sleep_until;
  for (;;) {
    if (state_of(w) != kOpen) return w;
    if (last_wait_ == Wait::kNone) last_wait_ = Wait::kSpun;
    bool busy = false;
    if (spin)
      spin_until(
          [&] {
            w = announced(position, w);
            busy = leave_for_busy_ && another_busy();
            return state_of(w) != kOpen || busy;
          },
          deadline);
    else
      busy = leave_for_busy_ && another_busy();
    if (state_of(w) != kOpen) return w;
    if (sleep.count() > 0 && !busy) {
      const auto now = Clock::now();
      if (!sleep_until) sleep_until = now + sleep;
      if (now < *sleep_until) {
        last_wait_ = Wait::kSlept;
        sleep_on(decision_word, w, *sleep_until);
        w = decision_word.load(std::memory_order_acquire);
        continue;
      }
    }
    // The others did not all come in time: nobody may commit this position any more.
    const uint64_t aborted = make_word(position, kAbort, count_of(w));
    if (decision_word.compare_exchange_strong(w, aborted, std::memory_order_acq_rel,
                                              std::memory_order_acquire)) {
      if (w & kSleeper) wake_sleepers(decision_word);  // other members asleep here
      if (count_of(w) > 1) announce(aborted, nullptr, 0);  // others wait here besides this one
      return aborted;
    }
  }
}

void Lane::sleep_on(std::atomic<uint64_t>& decision_word, uint64_t w, Clock::time_point until) {
  // Marked first: whoever changes the word after the mark wakes this member, and a change before
  // it fails the mark (or the futex's own comparison), so no wake-up is lost.
  const uint64_t marked = w | kSleeper;
  if (marked != w && !decision_word.compare_exchange_strong(w, marked, std::memory_order_acq_rel,
                                                            std::memory_order_acquire))
    return;
  futex_wait(low_half(decision_word), static_cast<uint32_t>(marked),
             std::chrono::duration_cast<std::chrono::nanoseconds>(until - Clock::now()));
}

void Lane::pass(uint64_t position) {
  passed(rank_).store(position, std::memory_order_release);
  next_ = position + 1;
}

void Lane::pass_waking_owners(uint64_t position) {
  // Sequentially consistent against a sleeper's count then look at `passed`: one of the two
  // sides sees the other, so no member waiting for this pass sleeps through it.
  passed(rank_).store(position, std::memory_order_seq_cst);
  if (sleepers(rank_).load(std::memory_order_seq_cst) != 0) futex_wake_all(low_half(passed(rank_)));
  next_ = position + 1;
}

}  // namespace krug::collectives::shm
