// Test helper: N engines as threads of one process over an in-memory store (as Gloo's tests
// run their ranks), and small builders for requests.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "rendezvous/store.h"

namespace krug::engine::testing {

inline Config rank_config(int rank, int size) {
  Config c;
  c.rank = rank;
  c.size = size;
  c.local_rank = rank;
  c.local_size = size;
  c.hostname = "localhost";
  c.secret = "engine-threads-test";
  c.timeout = Seconds(30.0);
  c.stall_check_disable = true;
  return c;
}

// Runs body(engine, rank) on `size` engines concurrently, one thread each; an exception on any
// rank fails the test naming the rank.
inline void run_ranks(int size, const std::function<void(Engine&, int)>& body,
                      const std::function<void(Config&)>& tweak = {}) {
  auto store = std::make_shared<rendezvous::InMemoryStore>();
  std::vector<std::thread> threads;
  std::vector<std::string> failures(size);
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        Config c = rank_config(r, size);
        if (tweak) tweak(c);
        Engine engine(c, store);
        body(engine, r);
        engine.shutdown();
      } catch (const std::exception& e) {
        failures[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
}

inline controller::Request request(const std::string& name, controller::OpType op, DataType dtype,
                                   std::vector<int64_t> shape) {
  controller::Request q;
  q.name = name;
  q.op = op;
  q.dtype = dtype;
  q.shape = std::move(shape);
  return q;
}

inline std::shared_ptr<HandleState> submit(Engine& e, controller::Request q, const void* in,
                                           void* out) {
  std::vector<TensorArgs> args;
  args.push_back(tensor_args(std::move(q), in, out));
  return e.enqueue(std::move(args));
}

inline void expect_ok(const std::shared_ptr<HandleState>& h) {
  h->wait();
  ASSERT_EQ(h->error(), "");
}

}  // namespace krug::engine::testing
