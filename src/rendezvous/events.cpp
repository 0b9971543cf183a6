#include "rendezvous/events.hpp"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

namespace ddprun::rdzv {

namespace {

std::string word(const std::string& s, size_t& pos) {
  size_t end = s.find(' ', pos);
  std::string w = s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
  pos = end == std::string::npos ? s.size() : end + 1;
  return w;
}

std::string one_line(std::string t) {
  for (char& c : t)
    if (c == '\n' || c == '\r') c = ' ';
  return t;
}

}  // namespace

std::string RoundEnd::describe() const {
  switch (kind) {
    case Kind::kDone: return "every node's workers succeeded";
    case Kind::kScaleUp: return fmt::format("a node is waiting to join ({})", text);
    default: return text;
  }
}

Event parse_event(const std::string& line) {
  Event e;
  size_t pos = 0;
  std::string first = word(line, pos);
  int64_t r = 0;
  if (!first.empty() && std::from_chars(first.data(), first.data() + first.size(), r).ec == std::errc() &&
      std::to_string(r) == first) {
    e.round = r;
    e.kind = word(line, pos);
  } else {
    e.kind = first;
  }
  e.node = word(line, pos);
  e.text = pos < line.size() ? line.substr(pos) : "";
  return e;
}

std::string round_event(int64_t round, const std::string& kind, const std::string& node, const std::string& text) {
  std::string t = one_line(text);
  return t.empty() ? fmt::format("{} {} {}", round, kind, node) : fmt::format("{} {} {} {}", round, kind, node, t);
}

std::string lost_event(const std::string& node) { return "lost " + node; }

std::string closed_event(const std::string& node, const std::string& reason) {
  std::string t = one_line(reason);
  return t.empty() ? "closed " + node : fmt::format("closed {} {}", node, t);
}

void RoundReader::start(int64_t round, std::vector<NodeDesc> members) {
  start(round, std::make_shared<const std::vector<NodeDesc>>(std::move(members)));
}

void RoundReader::start(int64_t round, std::shared_ptr<const std::vector<NodeDesc>> members) {
  round_ = round;
  members_ = std::move(members);
  events_.clear();
  exited_.clear();
  end_.reset();
  needs_exited_ = false;
  // Members already known to be gone end the round before it begins.
  for (auto& id : lost_.set())
    if (member(id)) events_.push_back(Event{-1, "lost", id, lost_why_[id]});
  reevaluate();
}

std::optional<std::string> LostIds::insert(const std::string& id) {
  if (!set_.insert(id).second) return std::nullopt;
  ++inserted_;
  order_.push_back(id);
  if (order_.size() <= kKept) return std::nullopt;
  std::string oldest = std::move(order_.front());
  order_.pop_front();
  set_.erase(oldest);
  return oldest;
}

void EventsTail::add(const std::vector<std::string>& lines) {
  count_ += lines.size();
  for (auto& l : lines) {
    Event e = parse_event(l);
    if (e.kind == "state" || (e.round >= 0 && e.round < keep_from_)) continue;
    lines_.push_back(l);
    if (e.kind == "lost" && ++lost_lines_ > LostIds::kKept) {  // the oldest lost line goes
      lines_.erase(std::find_if(lines_.begin(), lines_.end(), [](const std::string& x) {
        return parse_event(x).kind == "lost";
      }));
      --lost_lines_;
    }
  }
}

void EventsTail::keep_from(int64_t round) {
  if (round <= keep_from_) return;
  keep_from_ = round;
  std::erase_if(lines_, [&](const std::string& l) {
    Event e = parse_event(l);
    return e.round >= 0 && e.round < round;
  });
}

bool RoundReader::member(const std::string& id) const {
  for (auto& n : *members_)
    if (n.id == id) return true;
  return false;
}

std::string RoundReader::who(const std::string& id) const {
  for (auto& n : *members_)
    if (n.id == id) return n.describe();
  return id;
}

std::optional<RoundEnd> RoundReader::judge(const Event& e) const {
  using K = RoundEnd::Kind;
  if (e.kind == "lost") {
    if (!member(e.node) || exited_.count(e.node)) return std::nullopt;
    return RoundEnd{K::kLost, e.node, fmt::format("node {} was lost: {}", who(e.node), e.text)};
  }
  // The job was closed while this round ran (its store's host stopped, say): no round follows.
  if (e.kind == "closed") return RoundEnd{K::kClosed, e.node, e.text.empty() ? "the job was closed" : e.text};
  if (e.round != round_) return std::nullopt;
  if (e.kind == "done") return RoundEnd{K::kDone, e.node, ""};
  if (e.kind == "fail" && member(e.node))
    return RoundEnd{K::kFailed, e.node, fmt::format("node {}: {}", who(e.node), e.text)};
  if (e.kind == "leave" && member(e.node) && !exited_.count(e.node))
    return RoundEnd{K::kLeft, e.node, fmt::format("node {} left: {}", who(e.node), e.text)};
  // (Not a node whose lease ended: frozen past the window, it may ask when it runs again.)
  if (e.kind == "join" && !member(e.node) && !lost_.count(e.node)) return RoundEnd{K::kScaleUp, e.node, e.text};
  return std::nullopt;
}

std::optional<RoundEnd> RoundReader::feed(const std::vector<std::string>& lines) {
  for (auto& l : lines) {
    Event e = parse_event(l);
    if (e.kind == "lost") {
      if (auto forgot = lost_.insert(e.node)) lost_why_.erase(*forgot);
      lost_why_.emplace(e.node, e.text);
    } else if (e.round != round_ && e.kind != "closed") {
      continue;
    }
    if (round_ < 0) continue;
    if ((e.kind == "lost" || e.kind == "leave") && member(e.node)) needs_exited_ = true;
    events_.push_back(std::move(e));
  }
  if (!end_ && !needs_exited_) reevaluate();
  return end_;
}

void RoundReader::set_exited(std::set<std::string> exited) {
  exited_ = std::move(exited);
  needs_exited_ = false;
  reevaluate();
}

std::optional<RoundEnd> RoundReader::reevaluate() {
  if (end_ || round_ < 0 || needs_exited_) return end_;
  for (auto& e : events_)
    if (auto end = judge(e)) {
      end_ = end;
      return end_;
    }
  // Every member passed the exit barrier: done, whether or not the one that completed the
  // count lived to write "done" (it may die between its writes; its lost line woke us).
  if (!members_->empty() &&
      std::all_of(members_->begin(), members_->end(), [&](auto& n) { return exited_.count(n.id); }))
    end_ = RoundEnd{RoundEnd::Kind::kDone, "", ""};
  return end_;
}

}  // namespace ddprun::rdzv
