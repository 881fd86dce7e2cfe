// The collective algorithms of krug's TCP data plane for sets larger than
// TcpCommunicator::Options::direct_max_members, over a communicator's Links.
//
// Every member talks to O(log n) peers: recursive doubling and halving over a power-of-two
// number of "units", binomial trees for broadcast. Only alltoallv, whose every member has data
// for every other, and sendrecv talk to whoever the caller names.
//
// Units and association. With n members and k the largest power of two <= n, the first
// 2 (n - k) members pair up, (0 1) (2 3) ..., and every other member is a unit alone: k units in
// member order. A reduction first folds each pair (the odd member sends its buffer to the even
// one), then combines units in a fixed tree: round one pairs unit i with unit i + k/2, round two
// the results at distance k/4, and so on. Recursive doubling (every unit exchanges its whole
// buffer, for small buffers) and recursive halving (every unit exchanges the half it gives away,
// then an allgather; for large buffers) walk that same tree, and the ops krug reduces with
// are commutative bit for bit, so both give every member the same bits for an element whatever
// its offset, the buffer's size or the path taken: results are independent of fusion and
// reproducible run to run. The tree associates differently from the rank-ordered fold of the
// shared-memory plane (identical for integers, min and max; for floats, another rounding of the
// same sum); tests/conformance checks every element against this tree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/tcp/tcp_links.h"
#include "krug/types.h"

namespace krug::collectives::tcp {

struct Units {
  explicit Units(int members);
  int count;   // a power of two
  int paired;  // members 0 .. 2 * paired - 1 form pairs
  int of(int member) const { return member < 2 * paired ? member / 2 : member - paired; }
  int leader(int unit) const { return unit < paired ? 2 * unit : unit + paired; }
  // The odd member of a pair, whose buffer its leader folds in.
  bool folded(int member) const { return member < 2 * paired && member % 2 == 1; }
  bool leads_pair(int member) const { return member < 2 * paired && member % 2 == 0; }
};

// Grows on demand and keeps its memory across calls.
class Scratch {
 public:
  uint8_t* get(size_t bytes);

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t size_ = 0;
};

// Buffers up to this size take recursive doubling (log k rounds, whole buffer each); larger
// ones recursive halving and doubling (2 log k rounds, 2 (k-1)/k of the buffer in all).
inline constexpr size_t kDoublingBytes = 64 << 10;

struct Buffers {
  Scratch work;
  Scratch incoming;
};

void allreduce(Links& links, Buffers& buffers, void* data, size_t count, DataType dtype,
               ReduceOp op);
void reduce_scatter(Links& links, Buffers& buffers, const void* in, void* out,
                    const std::vector<size_t>& counts, DataType dtype, ReduceOp op);
void allgatherv(Links& links, const void* in, void* out, const std::vector<size_t>& bytes_per_rank);
void broadcast(Links& links, void* data, size_t bytes, int root);
void alltoallv(Links& links, const void* in, const std::vector<size_t>& send_bytes, void* out,
               const std::vector<size_t>& recv_bytes);

}  // namespace krug::collectives::tcp
