// Inputs the fuzzers (fuzz/) found crashing, leaking or hitting undefined behaviour, each fed to
// the parser it broke and expected to get that parser's documented error. The inputs stay in
// the fuzzers' seed corpora (fuzz/corpus/<target>/regression-*), read from there.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/config.h"
#include "controller/message.h"
#include "krug/types.h"
#include "net/socket.h"
#include "rendezvous/protocol.h"
#include "rendezvous/server_state.h"
#include "rendezvous/store.h"
#include "run/cli/horovod_config.h"

namespace krug {
namespace {

using ::testing::HasSubstr;

std::string corpus_file(const std::string& target, const std::string& name) {
  const std::string path = std::string(KRUG_SOURCE_DIR) + "/fuzz/corpus/" + target + "/" + name;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<uint8_t> corpus_bytes(const std::string& target, const std::string& name) {
  const std::string text = corpus_file(target, name);
  return {text.begin(), text.end()};
}

// A list length of 0x19000000 with a few bytes after it: the decoder allocated the whole list
// (~77 GB of Requests) before reading the first element.
TEST(FuzzRegressions, ControlMessageListLongerThanItsBytesIsTruncatedNotAllocated) {
  const auto bytes = corpus_bytes("control_message", "regression-huge-list-length");
  try {
    controller::decode_request_list(bytes);
    FAIL() << "decoded";
  } catch (const net::NetError& e) {
    EXPECT_THAT(e.what(), HasSubstr("truncated message"));
  }
  EXPECT_THROW(controller::decode_response_list(bytes), Error);
}

// The length checks' lower bounds must not reject lists of the smallest elements.
TEST(FuzzRegressions, ControlMessageListsOfTheSmallestElementsDecode) {
  controller::RequestList requests;
  requests.requests.resize(3);
  requests.cache_hits = {1, 2};
  const auto request_bytes = controller::encode(requests);
  EXPECT_EQ(controller::encode(controller::decode_request_list(request_bytes)), request_bytes);

  controller::ResponseList responses;
  responses.responses.resize(2);
  for (auto& r : responses.responses) r.from_cache = true;
  controller::Response unnamed;
  unnamed.names = {"", ""};
  unnamed.shapes = {{}, {}};
  responses.responses.push_back(unnamed);
  responses.stalls.resize(2);
  const auto response_bytes = controller::encode(responses);
  EXPECT_EQ(controller::encode(controller::decode_response_list(response_bytes)), response_bytes);
}

// add() of 0x2300000000000001 to a counter at 0x6f00000000000000 overflowed int64 in the
// rendezvous server (undefined behaviour); now the client gets an error reply.
TEST(FuzzRegressions, RendezvousCounterOverflowIsAnErrorReply) {
  auto in = corpus_bytes("rendezvous_frames", "regression-counter-overflow");
  rendezvous::ServerState state;
  std::vector<rendezvous::ServerState::Reply> replies;
  // Its get of a missing key parks the client: time it out, as the server loop would.
  while (state.handle_frames(1, in, rendezvous::ServerState::Clock::now(), replies))
    if (auto deadline = state.next_deadline()) state.expire(*deadline, replies);
  std::vector<std::string> errors;
  for (const auto& r : replies) {
    ASSERT_FALSE(r.payload.empty());
    if (r.payload[0] != uint8_t(rendezvous::protocol::Status::kError)) continue;
    net::Reader reader(r.payload.data() + 1, r.payload.size() - 1);
    errors.push_back(reader.str());
  }
  EXPECT_THAT(errors, ::testing::Contains(HasSubstr("overflows 64 bits")));
}

TEST(FuzzRegressions, InMemoryStoreCounterOverflowThrows) {
  rendezvous::InMemoryStore store;
  store.add("n", INT64_MAX);
  EXPECT_THROW(store.add("n", 1), Error);
  EXPECT_EQ(store.add("n", -1), INT64_MAX - 1);
}

// "? : " is a mapping whose key is null: yaml-cpp's as<std::string>() threw its own
// TypedBadConversion, which escaped krugrun's error handling and terminated it.
TEST(FuzzRegressions, HorovodConfigNonScalarKeyIsAnError) {
  const std::string text = corpus_file("horovod_config", "regression-null-key");
  try {
    run::parse_horovod_config(text, "config.yaml");
    FAIL() << "parsed";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("config.yaml:1:"));
    EXPECT_THAT(e.what(), HasSubstr("expected a name as the key"));
  }
  EXPECT_THROW(run::parse_horovod_config("params:\n  [a]: 1\n", "config.yaml"), Error);
}

Config load(const std::map<std::string, std::string>& env) {
  return load_config([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

// HOROVOD_START_TIMEOUT=67108867108864 (seconds): accepted, then its conversion to the clock's
// nanoseconds overflowed (undefined behaviour) wherever a deadline was made from it.
TEST(FuzzRegressions, DurationsTheClockCannotCountAreRejected) {
  std::map<std::string, std::string> env;
  std::istringstream lines(corpus_file("knobs", "regression-duration-overflow"));
  for (std::string line; std::getline(lines, line);)
    if (auto eq = line.find('='); eq != std::string::npos)
      env.emplace(line.substr(0, eq), line.substr(eq + 1));
  try {
    load(env);
    FAIL() << "loaded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("HOROVOD_START_TIMEOUT='67108867108864' is invalid"));
  }
  EXPECT_THROW(load({{"KRUG_TIMEOUT_SECONDS", "1e300"}}), Error);
  EXPECT_THROW(load({{"KRUG_BUSY_POLL_MICROSECONDS", "9223372036854775"}}), Error);
  EXPECT_EQ(load({{"KRUG_TIMEOUT_SECONDS", "3e9"}}).timeout, Seconds(3e9));  // 95 years: fine
}

}  // namespace
}  // namespace krug
