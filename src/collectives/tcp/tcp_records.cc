// The encrypted form of Links' messages (KRUG_ENCRYPT=1): records sealed with the connection's
// keys (net/cipher.h). See Links::Records.
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>

#include "collectives/tcp/tcp_links.h"

namespace krug::collectives::tcp {
namespace {

// Large enough that a record's tag and system calls cost little, small enough that the first
// bytes of a message go out (and its receiver starts opening them) while the rest is sealed.
constexpr size_t kRecordBytes = size_t{64} << 10;

}  // namespace

bool Links::pump_sealed_sends(int index) {
  Peer& p = peer(index);
  Records& r = p.records;
  net::Aead& seal = p.conn.cipher()->send;
  bool moved = false;
  while (!p.sends.empty()) {
    Message& m = p.sends.front();
    if (r.sealed_sent == r.sealed.size()) {
      // A message is done once its last record has left, not when it was sealed: its bytes
      // must be on the wire before a wait for the sends returns.
      if (m.left == 0) {
        p.sends.pop_front();
        --pending_sends_;
        continue;
      }
      const size_t n = std::min(kRecordBytes, m.left);
      r.sealed.resize(n + net::kTagSize);
      seal.seal({}, m.data, n, r.sealed.data(), r.sealed.data() + n);
      r.sealed_sent = 0;
      m.data += n;
      m.left -= n;
    }
    const size_t n = moved_bytes(index,
                                 ::send(p.conn.fd(), r.sealed.data() + r.sealed_sent,
                                        r.sealed.size() - r.sealed_sent, MSG_NOSIGNAL),
                                 true);
    if (n == 0) break;
    moved = true;
    r.sealed_sent += n;
  }
  return moved;
}

bool Links::pump_sealed_recvs(int index) {
  Peer& p = peer(index);
  Records& r = p.records;
  net::Aead& open = p.conn.cipher()->recv;
  bool moved = false;
  while (!p.recvs.empty()) {
    Message& m = p.recvs.front();
    if (r.recv_size == 0) {
      r.recv_size = std::min(kRecordBytes, m.left);
      r.recv_left = r.recv_size;
      r.tag_got = 0;
    }
    // The rest of the record's ciphertext straight into the message, then its tag.
    iovec parts[2];
    int count = 0;
    if (r.recv_left > 0) parts[count++] = {m.data, r.recv_left};
    parts[count++] = {r.tag + r.tag_got, net::kTagSize - r.tag_got};
    const size_t n = moved_bytes(index, ::readv(p.conn.fd(), parts, count), false);
    if (n == 0) break;
    moved = true;
    const size_t ciphertext = std::min(n, r.recv_left);
    m.data += ciphertext;
    m.left -= ciphertext;
    r.recv_left -= ciphertext;
    r.tag_got += n - ciphertext;
    if (r.tag_got < net::kTagSize) continue;
    if (!open.open({}, m.data - r.recv_size, r.recv_size, r.tag))
      throw net::NetError(
          describe(index) +
          ": a record failed authentication (altered on the way, or not this job's key)");
    r.recv_size = 0;
    if (m.left == 0) finish_recv(p);
  }
  return moved;
}

}  // namespace krug::collectives::tcp
