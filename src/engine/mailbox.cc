#include "engine/mailbox.h"

#include <algorithm>
#include <atomic>
#include <cstring>

namespace krug::engine {
namespace {

constexpr size_t kFrameHeader = 16;  // uint64 size + uint64 sequence number

size_t padded(size_t n) { return (n + 7) / 8 * 8; }

}  // namespace

// Producer and consumer counters on lines of their own: each side writes only its own.
struct Mailbox::Header {
  alignas(64) std::atomic<uint64_t> head;  // bytes ever written (producer)
  alignas(64) std::atomic<uint64_t> tail;  // bytes ever consumed (consumer)
  alignas(64) std::atomic<uint32_t> consumer_sleeping;
};

size_t Mailbox::bytes_for(size_t capacity) { return sizeof(Header) + (capacity + 63) / 64 * 64; }

Mailbox::Mailbox(uint8_t* memory, size_t capacity)
    : header_(reinterpret_cast<Header*>(memory)),
      ring_(memory + sizeof(Header)),
      capacity_(capacity) {}

void Mailbox::copy_in(uint64_t at, const uint8_t* src, size_t n) {
  const size_t offset = at % capacity_;
  const size_t first = std::min(n, capacity_ - offset);
  std::memcpy(ring_ + offset, src, first);
  std::memcpy(ring_, src + first, n - first);
}

void Mailbox::copy_out(uint64_t at, uint8_t* dst, size_t n) const {
  const size_t offset = at % capacity_;
  const size_t first = std::min(n, capacity_ - offset);
  std::memcpy(dst, ring_ + offset, first);
  std::memcpy(dst + first, ring_, n - first);
}

bool Mailbox::try_push(uint64_t seq, const uint8_t* data, size_t size) {
  const uint64_t head = header_->head.load(std::memory_order_relaxed);
  const uint64_t tail = header_->tail.load(std::memory_order_acquire);
  const size_t need = kFrameHeader + padded(size);
  if (size > largest_frame() || capacity_ - (head - tail) < need) return false;
  // Frames start 8-aligned and the capacity is a multiple of 8: each header word is whole.
  const uint64_t fields[2] = {size, seq};
  copy_in(head, reinterpret_cast<const uint8_t*>(fields), sizeof fields);
  if (size > 0) copy_in(head + kFrameHeader, data, size);
  header_->head.store(head + need, std::memory_order_release);
  return true;
}

bool Mailbox::consumer_sleeping() const {
  // Pairs with the fence in prepare_to_sleep(): either this sees the flag, or the consumer's
  // check after setting it sees the frame just pushed.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return header_->consumer_sleeping.load(std::memory_order_relaxed) != 0;
}

bool Mailbox::has_frame() const {
  return header_->head.load(std::memory_order_acquire) !=
         header_->tail.load(std::memory_order_relaxed);
}

uint64_t Mailbox::front_seq() const {
  uint64_t fields[2];
  copy_out(header_->tail.load(std::memory_order_relaxed), reinterpret_cast<uint8_t*>(fields),
           sizeof fields);
  return fields[1];
}

void Mailbox::pop(std::vector<uint8_t>& out) {
  const uint64_t tail = header_->tail.load(std::memory_order_relaxed);
  uint64_t fields[2];
  copy_out(tail, reinterpret_cast<uint8_t*>(fields), sizeof fields);
  const size_t size = fields[0];
  const size_t before = out.size();
  out.resize(before + size);
  if (size > 0) copy_out(tail + kFrameHeader, out.data() + before, size);
  header_->tail.store(tail + kFrameHeader + padded(size), std::memory_order_release);
}

bool Mailbox::prepare_to_sleep() {
  header_->consumer_sleeping.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!has_frame()) return true;
  awake();
  return false;
}

void Mailbox::awake() { header_->consumer_sleeping.store(0, std::memory_order_relaxed); }

}  // namespace krug::engine
