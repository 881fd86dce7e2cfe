// Bootstraps real Gloo contexts (TCP transport, ranks as threads) through GlooStore.
#include "rendezvous/gloo_store.h"

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gtest/gtest.h>

#include <thread>

#include "rendezvous/server.h"

namespace krug::rendezvous {
namespace {

using namespace std::chrono_literals;

// Runs `size` ranks; each connects a full mesh over the store `make_store(rank)` returns and
// allreduces {rank, rank + 1, ...}. Returns each rank's result.
std::vector<std::vector<float>> allreduce_ranks(
    int size, const std::function<std::shared_ptr<Store>(int)>& make_store) {
  constexpr size_t kCount = 1000;
  std::vector<std::vector<float>> results(size);
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        GlooStore store(make_store(rank), 30s);
        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        auto device = gloo::transport::tcp::CreateDevice(attr);
        auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
        context->setTimeout(30s);
        context->connectFullMesh(store, device);
        std::vector<float> data(kCount);
        for (size_t i = 0; i < kCount; ++i) data[i] = float(rank + i);
        gloo::AllreduceOptions opts(context);
        opts.setOutput(data.data(), data.size());
        opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(
            &gloo::sum<float>));
        gloo::allreduce(opts);
        results[rank] = std::move(data);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < size; ++rank) EXPECT_EQ(errors[rank], "") << "rank " << rank;
  return results;
}

void expect_sums(const std::vector<std::vector<float>>& results, int size) {
  float rank_sum = float(size * (size - 1) / 2);
  for (int rank = 0; rank < size; ++rank) {
    ASSERT_EQ(results[rank].size(), 1000u) << "rank " << rank;
    for (size_t i = 0; i < results[rank].size(); ++i)
      ASSERT_EQ(results[rank][i], rank_sum + float(size * i)) << "rank " << rank << " i " << i;
  }
}

TEST(GlooStoreTest, AllreduceOverInMemoryStore) {
  auto store = std::make_shared<InMemoryStore>();
  expect_sums(allreduce_ranks(4, [&](int) { return store; }), 4);
}

TEST(GlooStoreTest, AllreduceOverRendezvousServer) {
  std::string secret = make_job_secret();
  RendezvousServer server("127.0.0.1", 0, secret);
  expect_sums(allreduce_ranks(4, [&](int) {
                return std::make_shared<RendezvousClient>("127.0.0.1", server.port(), secret, 10s);
              }),
              4);
}

TEST(GlooStoreTest, ZeroTimeoutMeansTheAdapterTimeout) {
  auto inner = std::make_shared<InMemoryStore>();
  GlooStore store(inner, 50ms);
  EXPECT_THROW(store.wait({"nope"}, std::chrono::milliseconds(0)), StoreTimeout);
  store.set("k", {'x'});
  EXPECT_EQ(store.get("k"), std::vector<char>{'x'});
}

}  // namespace
}  // namespace krug::rendezvous
