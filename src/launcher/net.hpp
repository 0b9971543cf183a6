// What ddprun asks of the network around it: who holds a port, whether a rendezvous
// endpoint names this machine, and which local address reaches it.
#pragma once

#include <string>
#include <vector>

namespace ddprun {

// "pid 1234 (python3)" for the process listening on a TCP port, if this user can see it.
std::string who_listens(int port);

// The addresses of this machine's interfaces (IPv4 and IPv6, loopback included).
std::vector<std::string> local_addresses();

// Whether `host` names this machine: "localhost" or a loopback address, this machine's
// hostname (short or full), or a name or address that resolves to one of its
// interfaces' addresses. `why` says how it was decided, for a person.
bool names_this_machine(const std::string& host, const std::string& hostname, std::string& why);

// The local address this machine uses to reach host:port (no packet is sent); "" if none.
std::string outgoing_address(const std::string& host, int port);

}  // namespace ddprun
