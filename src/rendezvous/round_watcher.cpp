#include "rendezvous/round_watcher.hpp"

#include <set>

#include <fmt/format.h>

#include "rendezvous/dynamic_util.hpp"

namespace ddprun::rdzv::detail {

RoundWatcher::RoundWatcher(std::unique_ptr<Backend> events, Names names, RoundSignal& signal)
    : events_(std::move(events)), names_(std::move(names)), signal_(signal) {
  thread_ = std::thread([this] { loop(); });
}

RoundWatcher::~RoundWatcher() {
  events_->interrupt();  // a wait in progress returns now
  if (thread_.joinable()) thread_.join();
}

// The store client's error less its leading "store at H:P" (or the backend's own name):
// the line names the backend already. "store at H:P closed ..." becomes "it closed ...".
std::string RoundWatcher::without_address(std::string what) const {
  const std::string& b = names_.backend;
  const size_t at = b.find(" at ");
  for (const std::string& lead : {b, at == std::string::npos ? b : "store at " + b.substr(at + 4)}) {
    if (what.starts_with(lead + ": ")) return what.substr(lead.size() + 2);
    if (what.starts_with(lead + " ")) return "it" + what.substr(lead.size());
  }
  return what;
}

// A lost line about this node itself (frozen or cut off past the keep-alive window, it
// reads the line once it hears from the backend again): this node alone stops, and says
// it was the one lost. Before, it reported "the job failed on another node: node <itself>
// was lost".
RoundEnd RoundWatcher::as_seen_here(RoundEnd end) const {
  if (end.kind != RoundEnd::Kind::kLost || end.node != names_.me) return end;
  end.kind = RoundEnd::Kind::kPartitioned;
  end.text = fmt::format("this {}; {}", end.text, without_this_node(names_.fixed, "the other nodes"));
  return end;
}

// Round r's dump lines from other nodes among `lines`: handed to the caller.
void RoundWatcher::note_dumps(int64_t r, const std::vector<std::string>& lines) {
  std::vector<std::string> asked;
  for (auto& l : lines) {
    if (l.find(" dump ") == std::string::npos) continue;
    Event e = parse_event(l);
    if (e.kind == "dump" && e.round == r && e.node != names_.me) asked.push_back(e.text);
  }
  signal_.add_dumps(r, asked);
}

// Reads the events as they come; the first that ends the watched round wakes the caller.
// No round to watch (this node is joining one): then no read at all until a round is
// watched (RoundSignal::await). A wait on the events would wake a thousand idle watchers
// at every line, and a read once a second was a thousand requests a second while a big
// round formed. What came meanwhile is read when the next round is watched (its lost lines
// too); a store that is gone is the joiner's to find. A round whose end is known is read
// on until its node leaves it (stopping its workers, printing its summary): another node
// may still ask for a dump in it, its own hang or failure declared just after this one's
// end, and waits for this node's answer. Not once every worker finished (done) or the job
// closed: nobody asks then, and a thousand watchers would wake for the job's last lines.
void RoundWatcher::loop() {
  RoundReader reader;
  EventsTail seen;
  int64_t r = -1;
  // The round's end, if what was read so far says it ended: then the caller is woken.
  auto judge = [&] {
    if (signal_.ended(r)) return;  // (the first end counts)
    if (reader.needs_exited()) reader.set_exited(exited_before_lost(*events_, r));
    if (auto end = reader.end()) signal_.notify_end(r, as_seen_here(*end));
  };
  for (;;) {
    auto watch = signal_.await(r);
    if (!watch) return;
    if (watch->round < 0) test_pause("watcher-between-rounds");
    bool started = false;
    if (watch->round != r) {
      r = watch->round;
      if (r >= 0) {
        seen.keep_from(r);
        reader.start(r, watch->members);
        started = true;
      }
    }
    // Between rounds nothing is judged. (The caller may start the next round right after
    // await() said "between rounds": reading on here, the last round's reader, with its
    // end, would have reported that end as this node cut off, ending the new round at
    // once for this node alone.) The next await() returns the new round.
    if (r < 0) continue;
    try {
      if (started) {
        // Events read while the round before was watched: lost lines (a member lost before
        // round r began still ends it), and lines of round r itself.
        reader.feed(seen.lines());
        note_dumps(r, seen.lines());
        judge();
      }
      if (signal_.idle(r)) continue;
      size_t skip = 0;
      auto more = next_events(*events_, seen, /*wait=*/true, 1s, skip);
      if (skip) {
        seen.skip_to(skip);  // behind a trim: on from the first line held
        continue;
      }
      seen.add(more);
      reader.feed(more);
      note_dumps(r, more);
      judge();
    } catch (const std::exception& e) {
      if (signal_.stopped()) return;
      // This node frozen past the window (SIGSTOP, a paused VM): the store may be gone
      // because the others stopped without it. The keeper, thawed too, says so, with how
      // long this node did not run: it speaks first (the first end reported is kept).
      if (names_.lease_overdue && names_.lease_overdue() && signal_.sleep(500ms)) return;
      signal_.notify_end(-1, RoundEnd{RoundEnd::Kind::kStoreLost, "",
                                      fmt::format("lost the rendezvous at {}: {}{}", names_.backend,
                                                  without_address(e.what()), names_.lost_hint)});
      signal_.until_stopped();
      return;
    }
  }
}

}  // namespace ddprun::rdzv::detail
