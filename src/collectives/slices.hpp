// Bootstrap waits that notice a failed peer (internal, both backends).
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ddp/error.hpp"
#include "ddp/store.hpp"

namespace ddp::detail {

// Runs step(until) in slices of 0.1 s doubling to 2 s until it returns or the deadline
// passes; step throws TimeoutError when its slice ends. Between slices, aborted() returns why
// the wait is pointless (another rank reported a failure), which ends it at once with
// CollectiveError "gave up <what>: <why>", rather than every rank waiting out the timeout
// for a peer that is gone. At the deadline: TimeoutError naming what and the time waited.
template <class Step, class Aborted>
void wait_in_slices(std::chrono::steady_clock::time_point deadline, const std::string& what,
                    Step&& step, Aborted&& aborted) {
  using namespace std::chrono;
  const auto t0 = steady_clock::now();
  auto slice = milliseconds(100);
  for (;;) {
    const auto until = std::min(deadline, steady_clock::now() + slice);
    try {
      step(until);
      return;
    } catch (const TimeoutError& e) {
      if (std::optional<std::string> why = aborted())
        throw CollectiveError(fmt::format("gave up {}: {}", what, *why));
      if (until >= deadline)
        throw TimeoutError(fmt::format("{}: nothing after {} ms (last attempt: {})", what,
                                       duration_cast<milliseconds>(steady_clock::now() - t0).count(),
                                       e.what()));
    }
    slice = std::min(slice * 2, milliseconds(2000));
  }
}

// Store::wait for keys, sliced as above.
template <class Aborted>
void wait_for_keys(Store& store, const std::vector<std::string>& keys,
                   std::chrono::steady_clock::time_point deadline, const std::string& what,
                   Aborted&& aborted) {
  using namespace std::chrono;
  wait_in_slices(
      deadline, what,
      [&](steady_clock::time_point until) {
        auto left = duration_cast<milliseconds>(until - steady_clock::now());
        store.wait(keys, std::max(left, milliseconds(1)));
      },
      aborted);
}

}  // namespace ddp::detail
