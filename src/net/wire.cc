// Little-endian serialization for frames; strings and byte blobs carry a u32 length prefix.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "net/socket.h"

namespace krug::net {
namespace {

template <typename T>
void put_le(std::vector<uint8_t>& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

template <typename T>
T get_le(const uint8_t* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(p[i]) << (8 * i);
  return v;
}

}  // namespace

void Writer::u32(uint32_t v) { put_le(bytes_, v); }
void Writer::u64(uint64_t v) { put_le(bytes_, v); }
void Writer::f64(double v) { u64(std::bit_cast<uint64_t>(v)); }
void Writer::str(std::string_view s) { bytes(s.data(), s.size()); }

void Writer::bytes(const void* data, size_t size) {
  if (size > std::numeric_limits<uint32_t>::max())
    throw NetError(fmt::format("cannot serialize a {}-byte field (limit 4 GiB)", size));
  u32(static_cast<uint32_t>(size));
  const auto* p = static_cast<const uint8_t*>(data);
  bytes_.insert(bytes_.end(), p, p + size);
}

void Reader::need(size_t n) const {
  if (size_ - pos_ < n)
    throw NetError(fmt::format("truncated message: need {} bytes at offset {} of {}", n, pos_,
                               size_));
}

uint8_t Reader::u8() {
  need(1);
  return data_[pos_++];
}

uint32_t Reader::u32() {
  need(4);
  pos_ += 4;
  return get_le<uint32_t>(data_ + pos_ - 4);
}

uint64_t Reader::u64() {
  need(8);
  pos_ += 8;
  return get_le<uint64_t>(data_ + pos_ - 8);
}

double Reader::f64() { return std::bit_cast<double>(u64()); }

std::string Reader::str() {
  size_t n = u32();
  need(n);
  std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
  pos_ += n;
  return s;
}

size_t Reader::count(size_t min_bytes_each) {
  const size_t n = u32();
  if (n > (size_ - pos_) / std::max<size_t>(min_bytes_each, 1))
    throw NetError(
        fmt::format("truncated message: {} elements of at least {} bytes at offset {} "
                    "of {}",
                    n, min_bytes_each, pos_, size_));
  return n;
}

std::vector<uint8_t> Reader::bytes() {
  size_t n = u32();
  need(n);
  std::vector<uint8_t> v(data_ + pos_, data_ + pos_ + n);
  pos_ += n;
  return v;
}

}  // namespace krug::net
