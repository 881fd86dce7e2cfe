#include "rendezvous/elastic_protocol.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <map>

#include "krug/types.h"

namespace krug::rendezvous::elastic {
namespace {

// "a=1 b=x" -> {a: 1, b: x}; values contain no spaces (host names, integers, lists with ',').
std::map<std::string, std::string> fields(std::string_view text, std::string_view what) {
  std::map<std::string, std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    size_t end = text.find(' ', i);
    if (end == std::string_view::npos) end = text.size();
    std::string_view item = text.substr(i, end - i);
    i = end + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      throw Error(
          fmt::format("elastic: malformed {} '{}': '{}' is not name=value", what, text, item));
    out[std::string(item.substr(0, eq))] = std::string(item.substr(eq + 1));
  }
  return out;
}

int64_t number(const std::map<std::string, std::string>& f, const std::string& name,
               std::string_view text, std::string_view what) {
  auto it = f.find(name);
  int64_t v = 0;
  if (it == f.end() ||
      std::from_chars(it->second.data(), it->second.data() + it->second.size(), v).ec !=
          std::errc() ||
      std::to_string(v) != it->second)
    throw Error(fmt::format("elastic: malformed {} '{}': no integer '{}'", what, text, name));
  return v;
}

}  // namespace

std::string join_key(std::string_view worker, int64_t seq) {
  return fmt::format("elastic/join/{}/{}", worker, seq);
}
std::string assign_key(std::string_view worker, int64_t seq) {
  return fmt::format("elastic/assign/{}/{}", worker, seq);
}
std::string round_prefix(int64_t round) {
  return fmt::format("round{}", round);
}
// PrefixStore puts the '/' between its prefix and the key.
std::string health_key(int64_t round) {
  return round_prefix(round) + "/health";
}

std::string encode(const Assignment& a) {
  if (a.removed) return "removed=" + *a.removed;
  return fmt::format(
      "round={} rank={} size={} local_rank={} local_size={} cross_rank={} cross_size={} host={} "
      "new_workers={} hosts_version={}",
      a.round, a.rank, a.size, a.local_rank, a.local_size, a.cross_rank, a.cross_size, a.hostname,
      a.has_new_workers ? 1 : 0, a.hosts_version);
}

Assignment decode_assignment(std::string_view text) {
  Assignment a;
  if (text.rfind("removed=", 0) == 0) {
    a.removed = std::string(text.substr(8));
    return a;
  }
  auto f = fields(text, "assignment");
  auto n = [&](const char* name) { return number(f, name, text, "assignment"); };
  a.round = n("round");
  a.rank = static_cast<int>(n("rank"));
  a.size = static_cast<int>(n("size"));
  a.local_rank = static_cast<int>(n("local_rank"));
  a.local_size = static_cast<int>(n("local_size"));
  a.cross_rank = static_cast<int>(n("cross_rank"));
  a.cross_size = static_cast<int>(n("cross_size"));
  a.has_new_workers = n("new_workers") != 0;
  a.hosts_version = n("hosts_version");
  a.hostname = f["host"];
  if (a.size < 1 || a.rank < 0 || a.rank >= a.size || a.hostname.empty())
    throw Error(fmt::format("elastic: malformed assignment '{}'", text));
  return a;
}

std::string encode(const HostsVersion& h) {
  return fmt::format("version={} last_addition={}", h.version, h.last_addition);
}

HostsVersion decode_hosts_version(std::string_view text) {
  auto f = fields(text, "hosts version");
  return {number(f, "version", text, "hosts version"),
          number(f, "last_addition", text, "hosts version")};
}

std::string encode(const Health& h) {
  return fmt::format("elapsed_us={} tensors={} steps={} lateness_us={}", h.elapsed_us, h.tensors,
                     h.steps, fmt::join(h.lateness_us, ","));
}

Health decode_health(std::string_view text) {
  auto f = fields(text, "health report");
  Health h;
  h.elapsed_us = number(f, "elapsed_us", text, "health report");
  h.tensors = number(f, "tensors", text, "health report");
  h.steps = number(f, "steps", text, "health report");
  const std::string& list = f["lateness_us"];
  size_t i = 0;
  while (i < list.size()) {
    size_t end = list.find(',', i);
    if (end == std::string::npos) end = list.size();
    int64_t v = 0;
    if (std::from_chars(list.data() + i, list.data() + end, v).ec != std::errc())
      throw Error(fmt::format("elastic: malformed health report '{}'", text));
    h.lateness_us.push_back(v);
    i = end + 1;
  }
  return h;
}

}  // namespace krug::rendezvous::elastic
