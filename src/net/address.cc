#include "net/address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <set>

#include "net/socket.h"

namespace krug::net {
namespace {

std::string numeric_host(const sockaddr* addr, socklen_t len) {
  char buf[NI_MAXHOST];
  if (::getnameinfo(addr, len, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) != 0) return {};
  return buf;
}

struct IfAddrsDeleter {
  void operator()(ifaddrs* p) const { ::freeifaddrs(p); }
};
using IfAddrsPtr = std::unique_ptr<ifaddrs, IfAddrsDeleter>;

IfAddrsPtr interfaces() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0)
    throw NetError(fmt::format("getifaddrs failed: {}", std::strerror(errno)));
  return IfAddrsPtr(list);
}

}  // namespace

std::string source_address_toward(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), "9", &hints, &res); rc != 0)
    throw NetError(fmt::format("cannot resolve host '{}': {}", host, ::gai_strerror(rc)));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(res, ::freeaddrinfo);
  Fd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw NetError(fmt::format("socket failed: {}", std::strerror(errno)));
  // connect() on a datagram socket only picks the route and the source address.
  if (::connect(fd.get(), res->ai_addr, res->ai_addrlen) != 0)
    throw NetError(fmt::format("no route to host '{}': {}", host, std::strerror(errno)));
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0)
    throw NetError(fmt::format("getsockname failed: {}", std::strerror(errno)));
  return numeric_host(reinterpret_cast<sockaddr*>(&local), len);
}

std::string interface_address(const std::string& iface) {
  auto list = interfaces();
  std::set<std::string> names;
  for (ifaddrs* a = list.get(); a != nullptr; a = a->ifa_next) {
    names.insert(a->ifa_name);
    if (iface == a->ifa_name && a->ifa_addr != nullptr && a->ifa_addr->sa_family == AF_INET)
      return numeric_host(a->ifa_addr, sizeof(sockaddr_in));
  }
  if (names.count(iface) != 0)
    throw NetError(fmt::format("network interface '{}' has no IPv4 address", iface));
  throw NetError(fmt::format("no network interface '{}' on this host (it has: {})", iface,
                             fmt::join(names, ", ")));
}

std::vector<std::string> local_addresses() {
  auto list = interfaces();
  std::vector<std::string> out;
  for (ifaddrs* a = list.get(); a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    const int family = a->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    std::string s = numeric_host(
        a->ifa_addr, family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    if (auto pct = s.find('%'); pct != std::string::npos) s.resize(pct);  // fe80::1%eth0
    if (!s.empty()) out.push_back(s);
  }
  return out;
}

std::string advertise_address(const std::string& iface, const std::string& rendezvous_addr) {
  if (!iface.empty()) return interface_address(iface);
  if (rendezvous_addr.empty()) return "127.0.0.1";
  return source_address_toward(rendezvous_addr);
}

std::string join_host_port(const std::string& host, uint16_t port) {
  return host.find(':') == std::string::npos ? fmt::format("{}:{}", host, port)
                                             : fmt::format("[{}]:{}", host, port);
}

std::pair<std::string, uint16_t> split_host_port(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size())
    throw NetError("malformed address '" + address + "': expected host:port");
  std::string host = address.substr(0, colon);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return {host, static_cast<uint16_t>(std::stoul(address.substr(colon + 1)))};
}

}  // namespace krug::net
