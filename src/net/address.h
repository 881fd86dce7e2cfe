// Which address this machine is reachable at: the questions a multi-host job must answer before
// any rank can advertise itself to the others.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace krug::net {

// The local IPv4 address the kernel would send from to reach `host` (a routing-table lookup
// through a connected UDP socket: no packet is sent). "127.0.0.1" for loopback targets. Throws
// NetError naming the host when it cannot be resolved or no route leads there.
std::string source_address_toward(const std::string& host);

// The first IPv4 address of network interface `iface` (e.g. "eth0"). Throws NetError listing
// the interfaces that exist when it has none or does not exist.
std::string interface_address(const std::string& iface);

// Every IPv4 and IPv6 address assigned to an interface of this machine (network namespace).
std::vector<std::string> local_addresses();

// The address a rank advertises to its peers for the control and data planes: the address of
// `iface` when one is named, else the source address toward the rendezvous server (which every
// peer reaches too), else "127.0.0.1" for a job without one.
std::string advertise_address(const std::string& iface, const std::string& rendezvous_addr);

// "host:port", an IPv6 host in brackets: how a listener's address travels through the store.
std::string join_host_port(const std::string& host, uint16_t port);
// The inverse (brackets removed). Throws NetError naming `address` when it has no port.
std::pair<std::string, uint16_t> split_host_port(const std::string& address);

}  // namespace krug::net
