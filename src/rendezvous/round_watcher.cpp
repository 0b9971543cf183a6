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

// Round r's dump lines from other nodes among `lines`: handed to the caller.
void RoundWatcher::note_dumps(int64_t r, const std::vector<std::string>& lines) {
  std::vector<std::string> asked;
  for (auto& l : lines) {
    if (l.find(" dump ") == std::string::npos) continue;
    Event e = parse_event(l);
    if (e.kind == "dump" && e.round == r && e.node != names_.me) asked.push_back(e.text);
  }
  signal_.add_dumps(asked);
}

// Reads the events as they come; the first that ends the watched round wakes the caller.
// No round to watch (this node is joining one), or the watched one's end is known: then no
// wait on the events, which would wake a thousand idle watchers at every line. A new round
// to watch wakes this thread (RoundSignal::await); a read once a second still finds a
// store that is gone.
void RoundWatcher::loop() {
  RoundReader reader;
  EventsTail seen;
  int64_t r = -1;
  // The round's end, if what was read so far says it ended: then the caller is woken.
  auto judge = [&] {
    if (reader.needs_exited()) reader.set_exited(exited_before_lost(*events_, r));
    if (auto end = reader.end()) signal_.notify_end(r, *end);
  };
  for (;;) {
    auto watch = signal_.await(r);
    if (!watch) return;
    bool started = false;
    if (watch->round != r) {
      r = watch->round;
      if (r >= 0) {
        seen.keep_from(r);
        reader.start(r, watch->members);
        started = true;
      }
    }
    try {
      if (started) {
        // Events of round r that came before it was watched may already end it (a round of
        // `true` workers can be over by now), or ask for a dump (read while no round was).
        reader.feed(seen.lines());
        note_dumps(r, seen.lines());
        judge();
      }
      size_t skip = 0;
      auto more = next_events(*events_, seen, !signal_.idle(r), 1s, skip);
      if (skip) {
        seen.skip_to(skip);  // behind a trim: on from the first line held
        continue;
      }
      seen.add(more);
      reader.feed(more);  // before a round is watched: remembers lost lines
      if (r >= 0) {
        note_dumps(r, more);
        judge();
      }
    } catch (const std::exception& e) {
      if (signal_.stopped()) return;
      signal_.notify_end(-1, RoundEnd{RoundEnd::Kind::kStoreLost, "",
                                      fmt::format("lost the rendezvous at {}: {}{}", names_.backend, e.what(),
                                                  names_.lost_hint)});
      signal_.until_stopped();
      return;
    }
  }
}

}  // namespace ddprun::rdzv::detail
