#include "rendezvous/events.hpp"

#include <charconv>

#include <fmt/format.h>

namespace ddprun::rdzv {

std::string RoundEnd::describe() const {
  switch (kind) {
    case Kind::kDone: return "every node's workers succeeded";
    case Kind::kScaleUp: return fmt::format("a node is waiting to join ({})", text);
    default: return text;
  }
}

LogLine parse_line(const std::string& line) {
  LogLine l;
  auto a = line.find(' ');
  l.kind = line.substr(0, a);
  if (a == std::string::npos) return l;
  auto b = line.find(' ', a + 1);
  l.node = line.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
  if (b != std::string::npos) l.text = line.substr(b + 1);
  return l;
}

std::string make_line(const std::string& kind, const std::string& node, const std::string& text) {
  std::string t = text;
  for (char& c : t)
    if (c == '\n' || c == '\r') c = ' ';
  return t.empty() ? fmt::format("{} {}", kind, node) : fmt::format("{} {} {}", kind, node, t);
}

std::optional<RoundEnd> interpret_round(const std::vector<std::string>& lines, const std::vector<NodeDesc>& members,
                                        const std::set<std::string>& exited) {
  auto member = [&](const std::string& id) {
    for (auto& n : members)
      if (n.id == id) return true;
    return false;
  };
  auto who = [&](const std::string& id) {
    for (auto& n : members)
      if (n.id == id) return n.describe();
    return id;
  };
  using K = RoundEnd::Kind;
  for (const auto& raw : lines) {
    LogLine l = parse_line(raw);
    if (l.kind == "done") return RoundEnd{K::kDone, l.node, ""};
    if (l.kind == "fail" && member(l.node))
      return RoundEnd{K::kFailed, l.node, fmt::format("node {}: {}", who(l.node), l.text)};
    if ((l.kind == "leave" || l.kind == "lost") && member(l.node) && !exited.count(l.node)) {
      K k = l.kind == "leave" ? K::kLeft : K::kLost;
      std::string text = k == K::kLeft ? fmt::format("node {} left: {}", who(l.node), l.text)
                                       : fmt::format("node {} was lost: {}", who(l.node), l.text);
      return RoundEnd{k, l.node, text};
    }
    if (l.kind == "join" && !member(l.node)) return RoundEnd{K::kScaleUp, l.node, l.text};
  }
  return std::nullopt;
}

bool find_master(const std::vector<std::string>& lines, std::string& addr, int& port) {
  for (const auto& raw : lines) {
    LogLine l = parse_line(raw);
    if (l.kind != "master") continue;
    auto sp = l.text.rfind(' ');
    if (sp == std::string::npos) continue;
    int p = 0;
    auto s = l.text.substr(sp + 1);
    if (std::from_chars(s.data(), s.data() + s.size(), p).ec != std::errc()) continue;
    addr = l.text.substr(0, sp);
    port = p;
    return true;
  }
  return false;
}

}  // namespace ddprun::rdzv
