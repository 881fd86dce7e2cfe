// A one-way queue of frames in shared memory between two processes of one host: the control
// plane's messages inside a host, passed without a system call or a TCP round trip (which costs
// 14-23 us even between two spinning processes on this project's VM).
//
// One producer, one consumer. A consumer about to sleep says so first (set_consumer_sleeping);
// a producer that then sees the flag rings the doorbell (the TCP connection beside the mailbox,
// which the consumer sleeps on in poll()), and otherwise never enters the kernel. Both sides
// order flag and frames with sequentially consistent fences, so a frame is never left unseen by
// a consumer that went to sleep.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace krug::engine {

class Mailbox {
 public:
  // Shared bytes a mailbox of `capacity` ring bytes needs (a multiple of 64).
  static size_t bytes_for(size_t capacity);

  // `memory` holds bytes_for(capacity) bytes, zero-filled when the segment was created; both
  // ends construct a Mailbox over the same bytes. `capacity` is a multiple of 8.
  Mailbox(uint8_t* memory, size_t capacity);

  // The largest frame the ring takes; the sender sends larger ones another way.
  size_t largest_frame() const { return capacity_ / 2; }

  // Producer. False when the ring lacks room for it now (the consumer has not caught up): the
  // sender then sends it another way and never waits, because the consumer may itself be
  // waiting for the sender (in a collective) and not reading. `seq` orders the frames of both
  // ways.
  bool try_push(uint64_t seq, const uint8_t* data, size_t size);
  // Producer, after a push: whether the consumer sleeps and must be woken.
  bool consumer_sleeping() const;

  // Either end: whether a frame pushed is not yet taken (the producer asks whether the
  // consumer took everything).
  bool has_frame() const;

  // Consumer.
  // The sequence number of the next frame (has_frame() must be true).
  uint64_t front_seq() const;
  // Pops the next frame (has_frame() must be true), appending its bytes to `out`.
  void pop(std::vector<uint8_t>& out);
  // Before a blocking poll(): true = sleep, false = a frame is here already (flag cleared).
  bool prepare_to_sleep();
  void awake();

 private:
  struct Header;
  void copy_in(uint64_t at, const uint8_t* src, size_t n);
  void copy_out(uint64_t at, uint8_t* dst, size_t n) const;

  Header* header_;
  uint8_t* ring_;
  size_t capacity_;
};

}  // namespace krug::engine
