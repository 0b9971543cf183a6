// etcd endpoints: parsed and printed in ddprun itself (the transport is a plugin, http.cpp).
#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "rendezvous/etcd/http.hpp"

namespace ddprun::rdzv::etcd {

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

uint16_t parse_port(const std::string& s, const std::string& item) {
  bool digits = !s.empty() && s.size() <= 5 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  int port = digits ? std::stoi(s) : 0;
  if (port < 1 || port > 65535)
    throw ddp::UsageError(fmt::format("etcd endpoint '{}': the port must be a number from 1 to 65535", item));
  return static_cast<uint16_t>(port);
}

Endpoint parse_one(std::string item, bool https, const std::string& original) {
  for (auto [scheme, tls] : {std::pair{"http://", false}, std::pair{"https://", true}}) {
    if (item.rfind(scheme, 0) != 0) continue;
    if (tls != https)
      throw ddp::UsageError(fmt::format("etcd endpoint '{}' says {} but protocol={}", original,
                                        tls ? "https" : "http", https ? "https" : "http"));
    item = item.substr(std::strlen(scheme));
  }
  while (!item.empty() && item.back() == '/') item.pop_back();
  Endpoint ep;
  std::string port;
  if (!item.empty() && item[0] == '[') {
    size_t close = item.find(']');
    if (close == std::string::npos || (close + 1 < item.size() && item[close + 1] != ':'))
      throw ddp::UsageError(fmt::format("etcd endpoint '{}': expected [address]:port", original));
    ep.host = item.substr(1, close - 1);
    if (close + 1 < item.size()) port = item.substr(close + 2);
    if (close + 1 < item.size() && port.empty())
      throw ddp::UsageError(fmt::format("etcd endpoint '{}': the port is missing after ':'", original));
  } else {
    size_t colon = item.find(':');
    if (colon != std::string::npos && item.find(':', colon + 1) != std::string::npos)
      throw ddp::UsageError(fmt::format("etcd endpoint '{}': write an IPv6 address in brackets, [addr]:port", original));
    ep.host = item.substr(0, colon);
    if (colon != std::string::npos) {
      port = item.substr(colon + 1);
      if (port.empty()) throw ddp::UsageError(fmt::format("etcd endpoint '{}': the port is missing after ':'", original));
    }
  }
  auto ok = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == ':' || c == '%'; };
  if (ep.host.empty() || !std::all_of(ep.host.begin(), ep.host.end(), ok))
    throw ddp::UsageError(fmt::format("etcd endpoint '{}': bad host name", original));
  if (!port.empty()) ep.port = parse_port(port, original);
  return ep;
}

}  // namespace

std::string Endpoint::str() const {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

std::vector<Endpoint> parse_endpoints(const std::string& list, bool https) {
  std::vector<Endpoint> out;
  size_t pos = 0;
  while (true) {
    size_t comma = list.find(',', pos);
    std::string item = trim(list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (item.empty()) throw ddp::UsageError(fmt::format("etcd endpoints '{}': an empty entry", list));
    out.push_back(parse_one(item, https, item));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace ddprun::rdzv::etcd
