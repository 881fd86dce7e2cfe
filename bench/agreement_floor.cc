// The floor under a direct-lane call at 2 ranks: two threads pinned to cores 0 and 1 make the
// same 4-byte "allreduce" over and over, agreeing on each with a protocol cut down to its fast
// path, beside a bare cache-line round trip:
//   round trip    each thread waits for the other's store to a shared counter, then stores;
//   word          the lane's agreement: both count in on a position's decision word, the last
//                 compares the other's call, writes the result beside the word and commits;
//   word, 3 lines the same with the other's call, a 40-byte signature and its data on three
//                 lines instead of one (as the lane lays out a slot and a room);
//   flags         each member posts its call and a flag in its own line, waits for the other's,
//                 then records what it saw and reads the flag again (a Dekker pair, which two
//                 members need to leave safely).
// What a real call costs beyond these is its own work. See docs/benchmarks.md, "2026-12-04,
// night".
//
//   agreement_floor [--calls N] [--rounds R]     (default 2000000 calls, 5 rounds)
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

namespace {

constexpr uint64_t kRing = 4;
constexpr uint64_t kCall = 42;  // every call is the same one
constexpr uint64_t kCommit = 0x80;

void pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

// The decision word of a position, its result beside it: (position << 8) | commit | count.
struct alignas(64) Decision {
  std::atomic<uint64_t> word{0};
  float result = 0;
};

// A member's call, signature and data at one position, on one line or on three.
template <bool kThreeLines>
struct alignas(64) Slot {
  uint64_t call = 0;
  alignas(kThreeLines ? 64 : 8) char signature[kThreeLines ? 40 : 8] = {};
  alignas(kThreeLines ? 64 : 4) float data = 0;
};

template <bool kThreeLines>
class WordAgreement {
 public:
  float run(int me, uint64_t position, float x) {
    auto& mine = slots_[me][position % kRing];
    mine.call = kCall;
    std::memset(mine.signature, 7, sizeof(mine.signature));
    mine.data = x;
    Decision& d = decisions_[position % kRing];
    uint64_t w = d.word.load(std::memory_order_acquire);
    for (;;) {
      const uint64_t in = (w >> 8) == position ? (w & 0x7f) : 0;
      uint64_t next = (position << 8) | (in + 1);
      if (in + 1 == 2) {  // the last in: compare, reduce, commit
        const auto& other = slots_[1 - me][position % kRing];
        const bool agree = other.call == kCall && std::memcmp(other.signature, mine.signature,
                                                              sizeof(mine.signature)) == 0;
        d.result = x + other.data;
        if (agree) next |= kCommit;
      }
      if (d.word.compare_exchange_weak(w, next, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
        w = next;
        break;
      }
    }
    while (!(w & kCommit)) {
      pause();
      w = d.word.load(std::memory_order_acquire);
    }
    return d.result;
  }

 private:
  Decision decisions_[kRing];
  Slot<kThreeLines> slots_[2][kRing];
};

class FlagAgreement {
 public:
  float run(int me, uint64_t position, float x) {
    Member& mine = members_[me][position % kRing];
    Member& other = members_[1 - me][position % kRing];
    mine.call = kCall;
    mine.data = x;
    mine.flag.store(position, std::memory_order_release);
    while (other.flag.load(std::memory_order_acquire) != position) pause();
    const bool agree = other.call == kCall;
    const float sum = x + other.data;
    mine.seen.store(position, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const bool still_posted = other.flag.load(std::memory_order_relaxed) == position;
    return agree && still_posted ? sum : -1.0f;
  }

 private:
  struct alignas(64) Member {
    std::atomic<uint64_t> flag{0};
    uint64_t call = 0;
    float data = 0;
    std::atomic<uint64_t> seen{0};
  };
  Member members_[2][kRing];
};

class RoundTrip {
 public:
  float run(int me, uint64_t position, float x) {
    const uint64_t mine = 2 * position + static_cast<uint64_t>(me);
    while (counter_.load(std::memory_order_acquire) != mine - 1) pause();
    counter_.store(mine, std::memory_order_release);
    return 2 * x;
  }

 private:
  alignas(64) std::atomic<uint64_t> counter_{1};
};

// Nanoseconds per call of `Protocol`, both threads making `calls` calls.
template <typename Protocol>
double ns_per_call(long calls) {
  auto protocol = std::make_unique<Protocol>();
  std::atomic<bool> wrong{false};
  auto member = [&](int me) {
    pin(me);
    for (long i = 1; i <= calls; ++i)
      if (protocol->run(me, static_cast<uint64_t>(i), 1.0f) != 2.0f) wrong = true;
  };
  const auto start = std::chrono::steady_clock::now();
  std::thread other(member, 1);
  member(0);
  other.join();
  if (wrong) {
    std::fprintf(stderr, "agreement_floor: a call gave a wrong result\n");
    std::exit(1);
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start)
             .count() /
         static_cast<double>(calls);
}

long flag_value(int argc, char** argv, const std::string& flag, long fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == flag) return std::strtol(argv[i + 1], nullptr, 10);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const long calls = flag_value(argc, argv, "--calls", 2000000);
  const long rounds = flag_value(argc, argv, "--rounds", 5);
  if (calls <= 0 || rounds <= 0) {
    std::fprintf(stderr, "usage: agreement_floor [--calls N] [--rounds R] (both > 0)\n");
    return 2;
  }
  std::printf("# ns per call, 2 threads on cores 0 and 1, %ld calls a round\n", calls);
  std::printf("# round  round-trip       word  word-3-lines      flags\n");
  for (long r = 1; r <= rounds; ++r)
    std::printf("%7ld %11.1f %10.1f %13.1f %10.1f\n", r, ns_per_call<RoundTrip>(calls),
                ns_per_call<WordAgreement<false>>(calls), ns_per_call<WordAgreement<true>>(calls),
                ns_per_call<FlagAgreement>(calls));
  return 0;
}
