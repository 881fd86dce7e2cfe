// Cross-memory reads (collectives/shm/cross_memory.h): a read of this process's own memory; a
// read of a process that does not exist fails with the reason; and the probe by which the
// members of a group agree whether all of them can read all the others, members as threads of
// one process (which may always read itself) or a member played by the test through the store.
#include "collectives/shm/cross_memory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace krug::collectives::shm {
namespace {

using namespace std::chrono_literals;

rendezvous::Bytes text(const std::string& s) {
  return rendezvous::Bytes(s.begin(), s.end());
}

constexpr pid_t kNoSuchPid = std::numeric_limits<int32_t>::max();  // beyond any pid_max

TEST(CrossMemory, AReadCopiesTheBytesAndAFailedOneSaysWhy) {
  std::vector<uint8_t> from(100000), to(from.size());
  for (size_t i = 0; i < from.size(); ++i) from[i] = static_cast<uint8_t>(i * 7);
  EXPECT_EQ(read_process_memory(::getpid(), to.data(), from.data(), from.size()), "");
  EXPECT_EQ(to, from);
  const std::string why = read_process_memory(kNoSuchPid, to.data(), from.data(), 8);
  EXPECT_NE(why.find("process_vm_readv from pid"), std::string::npos) << why;
}

TEST(CrossMemory, MembersThatCanAllReadEachOtherAgreeAndLearnThePids) {
  rendezvous::InMemoryStore store;
  std::vector<std::vector<pid_t>> got(3);
  std::vector<std::thread> members;
  for (int m = 0; m < 3; ++m)
    members.emplace_back([&, m] { got[m] = probe_cross_memory(m, 3, store, 10s); });
  for (auto& t : members) t.join();
  for (const auto& pids : got) EXPECT_EQ(pids, std::vector<pid_t>(3, ::getpid()));
}

TEST(CrossMemory, OneMemberThatCannotReadOrBeReadTurnsItOffForAll) {
  // Member 1, played here: first it offers a word nobody can read, then it offers a readable one
  // but says it could not read member 0. Either way member 0 must not use it.
  const uint64_t member_1_word = 0x6b72756700000001ULL;
  for (bool readable : {false, true}) {
    rendezvous::InMemoryStore store;
    const pid_t pid = readable ? ::getpid() : kNoSuchPid;
    store.set("cma/1", text(std::to_string(pid) + " " +
                            std::to_string(reinterpret_cast<uintptr_t>(&member_1_word))));
    store.set("cma_ok/1", text(readable ? "0" : "1"));
    EXPECT_TRUE(probe_cross_memory(0, 2, store, 10s).empty()) << "readable " << readable;
    const auto answer = store.get("cma_ok/0", 1s);
    EXPECT_EQ(std::string(answer.begin(), answer.end()), readable ? "1" : "0");
  }
}

}  // namespace
}  // namespace krug::collectives::shm
