// What ddprun asks of the network around it: who holds a port, whether a rendezvous
// endpoint names this machine, and which local address reaches it.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ddprun {

// "pid 1234 (python3)" for the process listening on a TCP port, if this user can see it.
std::string who_listens(int port);
// " by pid N (name)" for a message about port, "" when who_listens finds nobody.
std::string held_by(int port);

// Whether something accepts TCP connections at host:port (any of its addresses): a
// connection completed, or one left pending by a full accept queue; false when refused.
bool accepts_connections(const std::string& host, int port);

// This machine's range of ephemeral ports (net.ipv4.ip_local_port_range).
std::pair<int, int> ephemeral_ports();

// This machine's host name (gethostname; "localhost" when it has none).
std::string host_name();

// The addresses of this machine's interfaces (IPv4 and IPv6, loopback included).
std::vector<std::string> local_addresses();

// Whether `host` names this machine: "localhost" or a loopback address, this machine's
// hostname (short or full), or a name or address that resolves to one of its
// interfaces' addresses. `why` says how it was decided, for a person.
bool names_this_machine(const std::string& host, const std::string& hostname, std::string& why);

// The local address this machine uses to reach host:port (no packet is sent); "" if none.
std::string outgoing_address(const std::string& host, int port);

// "localhost", "*.localhost", 127.x.y.z, ::1: a name that can only mean this machine.
bool is_loopback_host(const std::string& host);

struct PublishedAddress {
  std::string addr;    // what this node publishes for the others (MASTER_ADDR when rank 0)
  std::string note;    // why it is not the obvious one, for an info/warn line ("" when it is)
  bool loopback_only = false;  // no address but loopback exists: only this machine's nodes can use it
};

// The address other nodes reach this one at, given the endpoint they all use: the local
// address that routes to the endpoint; when that is loopback although the endpoint is not
// a loopback name (a Debian-style "127.0.1.1 <hostname>" line), the address of the
// interface of the default route, else of any interface that is up.
PublishedAddress address_for_peers(const std::string& endpoint_host, int port);

}  // namespace ddprun
