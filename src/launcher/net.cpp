#include "launcher/net.hpp"
#include "launcher/fileio.hpp"
#include "store/socket_util.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ddprun {

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

namespace {

std::string address_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  else if (sa->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  return buf;
}

std::vector<std::string> resolve(const std::string& host, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  std::vector<std::string> out;
  if (rc != 0) {
    error = gai_strerror(rc);
    return out;
  }
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    std::string a = address_text(ai->ai_addr);
    if (!a.empty() && std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
  }
  freeaddrinfo(res);
  return out;
}

bool is_loopback(const std::string& a) { return a.starts_with("127.") || a == "::1" || a.starts_with("::ffff:127."); }

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// One address of accepts_connections(): a probe that leaves no TIME_WAIT and no socket
// connected to itself behind.
bool accepts_at(const addrinfo* ai) {
  const int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  bool yes = ::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
  if (!yes && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof err;
    yes = ::poll(&p, 1, 100) == 0 ||  // no answer yet: a listener whose queue is full
          (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0);
  }
  yes = yes && !ddp::detail::self_connected(fd);
  ddp::detail::close_with_reset(fd);  // (a probe's port is not held in TIME_WAIT after it)
  return yes;
}
}  // namespace

bool accepts_connections(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return false;
  bool yes = false;
  for (const addrinfo* ai = res; ai && !yes; ai = ai->ai_next) yes = accepts_at(ai);
  ::freeaddrinfo(res);
  return yes;
}

std::pair<int, int> ephemeral_ports() {
  std::istringstream in(read_file("/proc/sys/net/ipv4/ip_local_port_range").value_or("32768 60999"));
  std::pair<int, int> r{32768, 60999};
  in >> r.first >> r.second;
  return r;
}

std::string held_by(int port) {
  const std::string holder = who_listens(port);
  return holder.empty() ? "" : " by " + holder;
}

// "pid 1234 (python3)" for the process listening on a TCP port, if this user can see it.
std::string who_listens(int port) {
  std::set<std::string> inodes;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::istringstream f(read_file(table).value_or(""));
    std::string line;
    std::getline(f, line);
    while (std::getline(f, line)) {
      std::istringstream ss(line);
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
      ss >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode;
      auto colon = local.rfind(':');
      if (colon == std::string::npos || st != "0A") continue;
      if (std::stoi(local.substr(colon + 1), nullptr, 16) == port) inodes.insert("socket:[" + inode + "]");
    }
  }
  if (inodes.empty()) return "";
  DIR* proc = opendir("/proc");
  if (!proc) return "";
  std::string found;
  while (dirent* e = readdir(proc)) {
    if (!isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
    std::string fddir = std::string("/proc/") + e->d_name + "/fd";
    DIR* fds = opendir(fddir.c_str());
    if (!fds) continue;
    while (dirent* fe = readdir(fds)) {
      char target[128];
      ssize_t n = readlink((fddir + "/" + fe->d_name).c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = 0;
      if (inodes.count(target)) {
        std::istringstream comm(read_file(std::string("/proc/") + e->d_name + "/comm").value_or(""));
        std::string name;
        std::getline(comm, name);
        found = fmt::format("pid {} ({})", e->d_name, name);
        break;
      }
    }
    closedir(fds);
    if (!found.empty()) break;
  }
  closedir(proc);
  return found;
}

std::vector<std::string> local_addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
    std::string a = address_text(i->ifa_addr);
    if (!a.empty() && std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
  }
  freeifaddrs(list);
  return out;
}

bool names_this_machine(const std::string& host, const std::string& hostname, std::string& why) {
  const std::string h = lower(host), me = lower(hostname);
  if (is_loopback_host(h)) {
    why = fmt::format("'{}' is this machine's loopback", host);
    return true;
  }
  auto shortname = [](const std::string& n) { return n.substr(0, n.find('.')); };
  if (h == me || (h.find('.') == std::string::npos && h == shortname(me)) ||
      (me.find('.') == std::string::npos && shortname(h) == me)) {
    why = fmt::format("'{}' is this machine's hostname ({})", host, hostname);
    return true;
  }
  std::string error;
  auto addrs = resolve(host, error);
  if (addrs.empty()) {
    why = fmt::format("'{}' does not resolve ({}), so it cannot be this machine", host, error);
    return false;
  }
  auto mine = local_addresses();
  for (auto& a : addrs)
    if (std::find(mine.begin(), mine.end(), a) != mine.end() || is_loopback(a)) {
      why = fmt::format("'{}' resolves to {}, an address of this machine", host, a);
      return true;
    }
  std::vector<std::string> shown;
  for (auto& a : mine)
    if (!is_loopback(a) && !a.starts_with("fe80")) shown.push_back(a);
  why = fmt::format("'{}' ({}) is not this machine: its hostname is '{}' and its addresses are {}", host,
                    fmt::join(addrs, ", "), hostname, shown.empty() ? "loopback only" : fmt::format("{}", fmt::join(shown, ", ")));
  return false;
}

std::string outgoing_address(const std::string& host, int port) {
  std::string error;
  auto addrs = resolve(host, error);
  for (auto& a : addrs) {
    bool v6 = a.find(':') != std::string::npos;
    int s = socket(v6 ? AF_INET6 : AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) continue;
    sockaddr_storage ss{};
    socklen_t len = 0;
    if (v6) {
      auto* sa = reinterpret_cast<sockaddr_in6*>(&ss);
      sa->sin6_family = AF_INET6;
      sa->sin6_port = htons(static_cast<uint16_t>(port ? port : 9));
      inet_pton(AF_INET6, a.c_str(), &sa->sin6_addr);
      len = sizeof *sa;
    } else {
      auto* sa = reinterpret_cast<sockaddr_in*>(&ss);
      sa->sin_family = AF_INET;
      sa->sin_port = htons(static_cast<uint16_t>(port ? port : 9));
      inet_pton(AF_INET, a.c_str(), &sa->sin_addr);
      len = sizeof *sa;
    }
    std::string local;
    if (connect(s, reinterpret_cast<sockaddr*>(&ss), len) == 0) {
      sockaddr_storage me{};
      socklen_t mlen = sizeof me;
      if (getsockname(s, reinterpret_cast<sockaddr*>(&me), &mlen) == 0) local = address_text(reinterpret_cast<sockaddr*>(&me));
    }
    close(s);
    if (!local.empty()) return local;
  }
  return "";
}

namespace {

// The interface of the IPv4 default route (/proc/net/route), "" when there is none.
std::string default_route_interface() {
  std::istringstream f(read_file("/proc/net/route").value_or(""));
  std::string line;
  std::getline(f, line);
  while (std::getline(f, line)) {
    std::istringstream ss(line);
    std::string iface, dest;
    ss >> iface >> dest;
    if (dest == "00000000") return iface;
  }
  return "";
}

// An address of this machine that another host can use: the default route's interface
// first, then any other interface that is up (IPv4 before IPv6; never loopback or
// link-local, which would need an interface name on the other side).
std::string routable_local_address() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  const std::string via = default_route_interface();
  std::string best;
  int best_rank = 99;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    std::string a = address_text(i->ifa_addr);
    if (a.empty() || is_loopback(a) || lower(a).starts_with("fe80") || a.starts_with("169.254.")) continue;
    int rank = (via == i->ifa_name ? 0 : 2) + (family == AF_INET ? 0 : 1);
    if (rank < best_rank) best_rank = rank, best = a;
  }
  freeifaddrs(list);
  return best;
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  const std::string h = lower(host);
  return h == "localhost" || h.ends_with(".localhost") || is_loopback(h) || h == "[::1]";
}

PublishedAddress address_for_peers(const std::string& endpoint_host, int port) {
  PublishedAddress r;
  r.addr = outgoing_address(endpoint_host, port);
  if (!r.addr.empty() && !is_loopback(r.addr)) return r;
  if (is_loopback_host(endpoint_host)) {
    // The endpoint itself is this machine's loopback: every node of the job is here.
    if (r.addr.empty()) r.addr = "127.0.0.1";
    return r;
  }
  // A name that resolves to loopback here (Debian's "127.0.1.1 <hostname>"), or to nothing
  // this machine can route to: the other hosts reach this one by an interface's address.
  const std::string routed = r.addr;
  r.addr = routable_local_address();
  if (!r.addr.empty()) {
    r.note = fmt::format("'{}' leads to {} on this machine, a loopback address other hosts cannot use: publishing "
                         "{} instead (--local-addr chooses another)",
                         endpoint_host, routed.empty() ? "no address" : routed, r.addr);
    return r;
  }
  r.addr = routed.empty() ? "127.0.0.1" : routed;
  r.note = fmt::format("'{}' leads to loopback here and this machine has no other network interface that is up: "
                       "publishing {}, which only nodes on this machine can reach (--local-addr chooses another)",
                       endpoint_host, r.addr);
  r.loopback_only = true;
  return r;
}

}  // namespace ddprun
