#include "rendezvous/dump_gather.hpp"

#include <algorithm>
#include <utility>

#include <spdlog/spdlog.h>

namespace ddprun::rdzv::detail {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::string dump_answer_line(const std::string& what, const std::string& answer) { return what + "\t" + answer; }

DumpGatherer::~DumpGatherer() {
  for (auto& g : gathers_) stop(g);
  for (auto& g : gathers_) g.thread.join();
}

// Ends the reader: its wait in progress returns now (and every later call fails).
void DumpGatherer::stop(Gather& g) {
  {
    std::lock_guard lk(g.mu);
    g.stop = true;
  }
  g.cv.notify_all();
  g.backend->interrupt();
}

void DumpGatherer::start(std::unique_ptr<Backend> b, int64_t r, std::string what, size_t nodes,
                         Clock::time_point t0, Clock::time_point deadline) {
  gathers_.remove_if([](Gather& g) {  // those that reported: a long job keeps no threads
    if (!g.done) return false;
    g.thread.join();
    return true;
  });
  Gather& g = gathers_.emplace_back();
  g.backend = std::move(b);
  g.thread = std::thread([this, &g, r, what = std::move(what), nodes, t0, deadline] {
    run(g, r, what, nodes, t0, deadline);
    g.done = true;
  });
}

// Reports at the deadline (or once all answered), then stops the reader.
void DumpGatherer::run(Gather& g, int64_t r, const std::string& what, size_t nodes, Clock::time_point t0,
                       Clock::time_point deadline) {
  std::thread reader([&g, r, &what, nodes, deadline] { read(g, r, what, nodes, deadline); });
  DumpAnswers got{what, {}, nodes, {}};
  bool stopped = false;
  {
    std::unique_lock lk(g.mu);
    g.cv.wait_until(lk, deadline, [&] { return g.answers.size() >= nodes || g.read_all || g.stop; });
    got.answers = g.answers;
    stopped = g.stop;
  }
  got.took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  if (!stopped) signal_.add_answers(std::move(got));
  stop(g);
  reader.join();
}

// Reads the round's dumps log in slices until every node answered, the deadline or stop.
void DumpGatherer::read(Gather& g, int64_t r, const std::string& what, size_t nodes, Clock::time_point deadline) {
  const std::string prefix = what + "\t";
  size_t from = 0;
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left <= 0ms) break;
    const auto slice = std::min<std::chrono::milliseconds>(left, 200ms);
    std::vector<std::string> lines;
    try {
      lines = g.backend->wait(dumps_log(r), from, slice);
    } catch (const std::exception& e) {
      spdlog::debug("rendezvous: reading the answers to {}: {}", what, e.what());
      std::unique_lock lk(g.mu);
      if (g.cv.wait_for(lk, slice, [&] { return g.stop; })) break;
      continue;
    }
    std::lock_guard lk(g.mu);
    from += lines.size();
    for (auto& l : lines)
      if (l.starts_with(prefix)) g.answers.push_back(l.substr(prefix.size()));
    if (g.stop || g.answers.size() >= nodes) break;
  }
  {
    std::lock_guard lk(g.mu);
    g.read_all = true;
  }
  g.cv.notify_all();
}

}  // namespace ddprun::rdzv::detail
