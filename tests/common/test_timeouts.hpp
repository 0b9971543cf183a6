// How long the tests are willing to wait, scaled by one factor (README, "Tests").
//
// DDP_TEST_TIMEOUT_SCALE (a positive number, default 1) multiplies every timeout in the
// tests that only guards against a hang, and every bound a test compares a duration with
// to check that something is "fast": a slow or loaded machine raises them all at once.
// Timeouts that are the behaviour under test (a 300 ms collective timeout whose message
// must say "300 ms") are not scaled. tests/common/test_timeouts.py is the Python twin.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace ddp::test {

// The factor, read once. A value that is not a positive number stops the test: a typo
// must not quietly run the suite at the default.
inline double timeout_scale() {
  static const double scale = [] {
    const char* v = std::getenv("DDP_TEST_TIMEOUT_SCALE");
    if (v == nullptr || *v == '\0') return 1.0;
    char* end = nullptr;
    double d = std::strtod(v, &end);
    if (end == v || *end != '\0' || !std::isfinite(d) || d <= 0) {
      std::fprintf(stderr, "DDP_TEST_TIMEOUT_SCALE='%s': expected a positive number\n", v);
      std::exit(2);
    }
    return d;
  }();
  return scale;
}

// d times the factor, rounded up to a millisecond.
inline std::chrono::milliseconds scaled(std::chrono::milliseconds d) {
  return std::chrono::milliseconds(
      static_cast<std::chrono::milliseconds::rep>(std::ceil(static_cast<double>(d.count()) * timeout_scale())));
}

// The same for a number of seconds.
inline double scaled_seconds(double seconds) { return seconds * timeout_scale(); }

// Polls pred every few milliseconds until it holds or `timeout` (a hang guard: scale it)
// has passed; returns its last value.
template <class Pred>
bool wait_until(Pred pred, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace ddp::test
