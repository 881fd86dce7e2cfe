// The shared-memory communicator with members as threads of this process (the collectives'
// common cases are the Communicator conformance suite's, tests/conformance): allreduce against
// values computed here, for sizes that take one step, many steps, and the small and
// large allreduce paths; rank-ordered sums bitwise equal to the reference association; failures
// that name the member; and nothing left in /dev/shm.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collectives/shm/shm_communicator.h"
#include "reduce/reduce.h"
#include "rendezvous/store.h"
#include "transport/shm_segment.h"

namespace krug::collectives::shm {
namespace {

using namespace std::chrono_literals;
using transport::remove_job_segments;
using transport::segment_prefix;

// Small slots, so modest buffers already take many steps (and both slot halves).
Options small_slots(const std::string& job) {
  Options o;
  o.job_id = job;
  o.slot_bytes = 4096;
  o.small_allreduce_bytes = 1024;
  o.timeout = 10s;
  return o;
}

std::string unique_job(const std::string& what) {
  return what + std::to_string(::getpid()) + "x" + std::to_string(std::random_device{}());
}

int segments_named(const std::string& job) {
  const std::string prefix = segment_prefix(job);
  int found = 0;
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (const dirent* e = ::readdir(dir))
      if (std::string(e->d_name).rfind(prefix, 0) == 0) ++found;
    ::closedir(dir);
  }
  return found;
}

// Runs body(comm, member) on `size` members, one thread each; returns each member's error.
std::vector<std::string> run_members(int size, const Options& options,
                                     const std::function<void(ShmCommunicator&, int)>& body) {
  rendezvous::InMemoryStore store;
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int m = 0; m < size; ++m)
    threads.emplace_back([&, m] {
      try {
        ShmCommunicator comm(m, size, store, options);
        body(comm, m);
      } catch (const std::exception& e) {
        errors[m] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

void expect_all_pass(int size, const Options& options,
                     const std::function<void(ShmCommunicator&, int)>& body) {
  const auto errors = run_members(size, options, body);
  for (int m = 0; m < size; ++m) EXPECT_EQ(errors[m], "") << "member " << m;
}

// Values whose float sums depend on the association, so a wrong order shows in the bits.
float value(int member, size_t i) {
  return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + member)) *
         (member % 2 ? 1e-3f : 1e4f);
}

class Sizes : public ::testing::TestWithParam<int> {};

TEST_P(Sizes, AllreduceSumsInRankOrderOnBothPaths) {
  const int size = GetParam();
  const std::string job = unique_job("ar");
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{200}, size_t{1000},
                       size_t{5000}, size_t{70001}}) {
    expect_all_pass(size, small_slots(job), [&](ShmCommunicator& comm, int m) {
      std::vector<float> x(count);
      for (size_t i = 0; i < count; ++i) x[i] = value(m, i);
      comm.allreduce(x.data(), count, DataType::kFloat32, ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i) {
        float expected = value(0, i);
        for (int r = 1; r < size; ++r) expected += value(r, i);
        ASSERT_EQ(std::memcmp(&x[i], &expected, sizeof(float)), 0)
            << "count " << count << " element " << i << ": " << x[i] << " vs " << expected;
      }
    });
  }
  EXPECT_EQ(segments_named(job), 0);
}

TEST_P(Sizes, AllreduceOfOtherTypesAndOps) {
  const int size = GetParam();
  expect_all_pass(size, small_slots(unique_job("ops")), [&](ShmCommunicator& comm, int m) {
    for (size_t count : {size_t{3}, size_t{3000}}) {
      std::vector<int64_t> x(count);
      std::iota(x.begin(), x.end(), int64_t{m});
      comm.allreduce(x.data(), count, DataType::kInt64, ReduceOp::kMax);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(x[i], int64_t(i) + size - 1);
      std::vector<double> y(count, m + 2.0);
      comm.allreduce(y.data(), count, DataType::kFloat64, ReduceOp::kProduct);
      double product = 1;
      for (int r = 0; r < size; ++r) product *= r + 2.0;
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(y[i], product);
    }
  });
}

// The parts path against what the engine's fusion buffer gives: concatenate, scale, allreduce,
// scale, split. Layouts cover empty parts, a part spanning many steps, a step's slices
// straddling parts, in place and out of place, a joined member's zeros (no input) and a result
// nobody keeps (no output).
TEST_P(Sizes, AllreducePartsMatchesAFusionBufferBitwise) {
  const int size = GetParam();
  const std::string job = unique_job("parts");
  const std::vector<std::vector<size_t>> layouts = {
      {1}, {0, 3, 0, 5}, {100, 1, 17, 300}, {2500}, {1000, 0, 1700, 9, 2}, {70001, 3}};
  for (const auto& counts : layouts) {
    for (const auto& [pre, post] : {std::pair{1.0, 1.0}, std::pair{0.5, 1.0 / 3.0}}) {
      expect_all_pass(size, small_slots(job), [&](ShmCommunicator& comm, int m) {
        const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
        // Reference: the fusion buffer the engine would build (part 1 from a joined member
        // when m == 1, that is zeros).
        std::vector<float> fused(total);
        std::vector<std::vector<float>> in(counts.size()), out(counts.size());
        std::vector<FusedPart> parts;
        size_t at = 0;
        for (size_t p = 0; p < counts.size(); ++p) {
          in[p].resize(counts[p]);
          for (size_t i = 0; i < counts[p]; ++i) in[p][i] = value(m, at + i);
          const bool joined = m == 1 && p == 1;
          const bool in_place = p % 2 == 0;
          const bool dropped = p == 2;
          for (size_t i = 0; i < counts[p]; ++i) fused[at + i] = joined ? 0.0f : in[p][i];
          out[p].assign(counts[p], -1.0f);
          void* o = dropped ? nullptr : in_place ? in[p].data() : out[p].data();
          parts.push_back({joined ? nullptr : in[p].data(), o, counts[p]});
          at += counts[p];
        }
        reduce::scale(DataType::kFloat32, fused.data(), total, pre);
        comm.allreduce(fused.data(), total, DataType::kFloat32, ReduceOp::kSum);
        reduce::scale(DataType::kFloat32, fused.data(), total, post);
        comm.allreduce_parts(parts, DataType::kFloat32, ReduceOp::kSum, pre, post);
        at = 0;
        for (size_t p = 0; p < counts.size(); ++p) {
          const auto& got = p % 2 == 0 ? in[p] : out[p];
          for (size_t i = 0; i < counts[p]; ++i) {
            if (p == 2) {
              ASSERT_EQ(out[p][i], -1.0f) << "a part without output was written";
              continue;
            }
            ASSERT_EQ(std::memcmp(&got[i], &fused[at + i], sizeof(float)), 0)
                << "part " << p << " element " << i << ": " << got[i] << " vs " << fused[at + i];
          }
          at += counts[p];
        }
      });
    }
  }
  EXPECT_EQ(segments_named(job), 0);
}

TEST_P(Sizes, AllreducePartsOfHalfFloatsMatchAFusionBuffer) {
  const int size = GetParam();
  expect_all_pass(size, small_slots(unique_job("parts16")), [&](ShmCommunicator& comm, int m) {
    const std::vector<size_t> counts = {3, 5000, 1};
    std::vector<uint16_t> fused;
    std::vector<std::vector<uint16_t>> in(counts.size());
    std::vector<FusedPart> parts;
    for (size_t p = 0; p < counts.size(); ++p) {
      for (size_t i = 0; i < counts[p]; ++i)
        in[p].push_back(reduce::float_to_half(value(m, fused.size() + i) * 1e-4f));
      fused.insert(fused.end(), in[p].begin(), in[p].end());
      parts.push_back({in[p].data(), in[p].data(), counts[p]});
    }
    comm.allreduce(fused.data(), fused.size(), DataType::kFloat16, ReduceOp::kSum);
    reduce::scale(DataType::kFloat16, fused.data(), fused.size(), 0.25);
    comm.allreduce_parts(parts, DataType::kFloat16, ReduceOp::kSum, 1.0, 0.25);
    size_t at = 0;
    for (size_t p = 0; p < counts.size(); ++p)
      for (size_t i = 0; i < counts[p]; ++i, ++at) ASSERT_EQ(in[p][i], fused[at]) << at;
  });
}

TEST_P(Sizes, ManyCollectivesInARowKeepTheMembersInStep) {
  const int size = GetParam();
  expect_all_pass(size, small_slots(unique_job("seq")), [&](ShmCommunicator& comm, int m) {
    for (int round = 0; round < 200; ++round) {
      int32_t x = m + round;
      comm.allreduce(&x, 1, DataType::kInt32, ReduceOp::kSum);
      ASSERT_EQ(x, size * round + size * (size - 1) / 2);
      if (round % 7 == 0) comm.barrier();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Members, Sizes, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

TEST(ShmCommunicator, NothingIsLeftInDevShmOnceEveryMemberHasMappedTheSegment) {
  const std::string job = unique_job("left");
  expect_all_pass(3, small_slots(job), [&](ShmCommunicator& comm, int) {
    comm.barrier();  // every member is past construction: the name is gone already
    EXPECT_EQ(segments_named(job), 0);
  });
}

TEST(ShmCommunicator, ABadSlotSizeIsRejectedBeforeAnySegmentExists) {
  const std::string job = unique_job("badslot");
  Options o = small_slots(job);
  o.slot_bytes = 1000;
  rendezvous::InMemoryStore store;
  try {
    ShmCommunicator comm(0, 1, store, o);
    FAIL() << "a slot of 1000 bytes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("slot size 1000"), std::string::npos) << e.what();
  }
  EXPECT_EQ(segments_named(job), 0);
}

TEST(ShmCommunicator, RemoveJobSegmentsRemovesOnlyThatJobsSegments) {
  const std::string job = unique_job("rm"), other = unique_job("keep");
  for (const std::string& name : {"/" + segment_prefix(job) + "a", "/" + segment_prefix(job) + "b",
                                  "/" + segment_prefix(other) + "c"}) {
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_GE(fd, 0) << name;
    ::close(fd);
  }
  EXPECT_EQ(remove_job_segments(job), 2);
  EXPECT_EQ(segments_named(job), 0);
  EXPECT_EQ(segments_named(other), 1);
  EXPECT_EQ(remove_job_segments(other), 1);
}

TEST(ShmCommunicator, SegmentIsOnlyForItsOwner) {
  const std::string job = unique_job("perm");
  rendezvous::InMemoryStore store;
  std::thread second([&] {
    // Holds the creator in construction until this member has looked at the segment.
    const auto name = store.get("shm/name", 10s);
    struct stat st {};
    ASSERT_EQ(::stat(("/dev/shm" + std::string(name.begin(), name.end())).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    ShmCommunicator comm(1, 2, store, small_slots(job));
  });
  ShmCommunicator comm(0, 2, store, small_slots(job));
  second.join();
}

TEST(ShmCommunicator, AMemberThatNeverArrivesIsNamedAfterTheTimeout) {
  Options options = small_slots(unique_job("late"));
  options.timeout = 300ms;
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_members(3, options, [](ShmCommunicator& comm, int m) {
    if (m == 2) return;  // never joins the allreduce
    float x = 1;
    comm.allreduce(&x, 1, DataType::kFloat32, ReduceOp::kSum);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 60s);  // a hang guard only
  // Member 0 or 1 times out first and aborts the segment; the other then stops at once with the
  // first one's message. Both name member 2.
  for (int m : {0, 1}) {
    EXPECT_NE(errors[m].find("shared-memory allreduce"), std::string::npos) << errors[m];
    EXPECT_NE(errors[m].find("rank 2 of the process set did not arrive"), std::string::npos)
        << errors[m];
  }
  EXPECT_EQ(errors[2], "");
}

TEST(ShmCommunicator, SendrecvWithoutAPointToPointCommunicatorSaysSo) {
  const auto errors = run_members(2, small_slots(unique_job("p2p")), [](ShmCommunicator& comm, int m) {
    uint8_t b = 0;
    comm.sendrecv(&b, 1, 1 - m, &b, 1, 1 - m);
  });
  for (const auto& e : errors) EXPECT_NE(e.find("none was attached"), std::string::npos) << e;
}

}  // namespace
}  // namespace krug::collectives::shm
