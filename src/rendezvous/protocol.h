// Wire protocol between RendezvousClient and RendezvousServer, after the HMAC handshake.
//
// Each request is one frame: u8 op, then the op's fields (net::Writer encoding: little-endian
// integers, u32-length-prefixed strings and blobs). Each reply is one frame: u8 status, then
// the result for kOk or a message string for kTimeout / kError. A client sends one request and
// waits for its reply; the server answers a connection's requests in order.
//
//   kSet   key:str value:bytes            -> kOk
//   kGet   key:str timeout_ms:u64         -> kOk value:bytes | kTimeout msg
//   kAdd   key:str delta:i64              -> kOk new_value:i64
//   kWait  n:u32 key:str * n timeout_ms:u64 -> kOk | kTimeout msg
//   kCheck n:u32 key:str * n               -> kOk present:u8
//   kErase key:str                         -> kOk
#pragma once

#include <cstdint>

namespace krug::rendezvous::protocol {

enum class Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kWait = 4, kCheck = 5, kErase = 6 };
enum class Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

}  // namespace krug::rendezvous::protocol
