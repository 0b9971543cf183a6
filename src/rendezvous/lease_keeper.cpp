#include "rendezvous/lease_keeper.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "rendezvous/dynamic_util.hpp"

namespace ddprun::rdzv::detail {

LeaseKeeper::LeaseKeeper(std::unique_ptr<Backend> lease, Settings s, RoundSignal& signal)
    : lease_(std::move(lease)), s_(std::move(s)), signal_(signal), renewed_at_(Clock::now().time_since_epoch().count()) {
  lease_->open_lease(ttl());
  lease_->on_lease_end("events", lost_event(s_.me));
  thread_ = std::thread([this] { loop(); });
}

LeaseKeeper::~LeaseKeeper() {
  if (thread_.joinable()) thread_.join();
  try {
    std::lock_guard lk(mu_);
    lease_->close();
  } catch (const std::exception& e) {
    spdlog::debug("rendezvous: closing the lease: {}", e.what());
  }
}

void LeaseKeeper::register_exit(int64_t round) {
  std::lock_guard lk(mu_);
  lease_->on_lease_end(exit_log(round), lost_event(s_.me));
  if (exit_registered_ >= 0 && exit_registered_ != round) lease_->drop_lease_end(exit_log(exit_registered_));
  exit_registered_ = round;
}

void LeaseKeeper::check_alive() {
  auto recent = [&] { return since_renewal() < ttl() / 2; };
  if (ended_) throw LeaseEnded("its lease ended: no renewal got through for the keep-alive window");
  if (recent() || failing_) return;  // failing_: the backend does not answer; the thread judges
  std::lock_guard lk(mu_);
  if (recent()) return;  // the thread renewed it meanwhile
  const auto sent = Clock::now();
  try {
    lease_->keep_alive(ttl());
    renewed_at_ = sent.time_since_epoch().count();
  } catch (const LeaseEnded&) {
    ended_ = true;
    throw;
  } catch (const std::exception& e) {
    spdlog::debug("rendezvous: renewing the lease: {}", e.what());
  }
}

Clock::duration LeaseKeeper::since_renewal() const {
  return Clock::now() - Clock::time_point(Clock::duration(renewed_at_.load()));
}

bool LeaseKeeper::overdue() const { return since_renewal() > ttl(); }

void LeaseKeeper::release() {
  std::lock_guard lk(mu_);
  spdlog::debug("rendezvous: releasing");
  lease_->release();
}

namespace {

// Why a frozen node lost its lease: this thread itself did not run for longer than an
// interval (a wake-up that late is no scheduling jitter).
std::string stopped_text(milliseconds stopped, milliseconds interval) {
  if (stopped < std::max<milliseconds>(interval, 500ms)) return "";
  return fmt::format(" (this node itself did not run for {} just before: its ddprun was stopped, or its host "
                     "starved or paused)",
                     seconds_text(stopped));
}

}  // namespace

std::string LeaseKeeper::going_on_without_this_node() const {
  if (s_.fixed) return without_this_node(true, "");
  return fmt::format("{} (if {} itself went silent, every node stops likewise)",
                     without_this_node(false, "the nodes that still reach it"), s_.backend);
}

// A lease that ended (the backend said so, or no renewal got through for the whole
// window) means the others go on without this node: it must stop. A renewal waits at least
// as long as this thread woke late from its pause (at most the window): when the whole host
// stalled (a loaded machine, a paused VM), the store did too, and the time it did not run
// is not counted against this node (docs/store.md, the lease).
// This node gives up one interval after the window from its last answered renewal: that
// renewal may have come up to an interval before the store fell silent, and a store host
// paused for less than the window (its ddprun stopped, a stall of its own) must find every
// node still there when it runs again (before: a pause of 10 s of a 15 s window could end
// the others' leases from their side). A node really cut off stops at most an interval after
// the store ended its lease; its workers cannot reach the others then anyway.
void LeaseKeeper::loop() {
  auto last_ok = Clock::now();
  milliseconds stalled{0}, stopped{0};  // how late this thread woke: capped, and as it was
  const milliseconds patience = ttl() + s_.interval;
  while (!signal_.stopped()) {
    auto left = std::chrono::duration_cast<milliseconds>(patience - (Clock::now() - last_ok));
    bool ended = false;
    std::string why;
    const auto sent = Clock::now();
    try {
      std::lock_guard lk(mu_);
      lease_->keep_alive(std::max({left, stalled, milliseconds(100)}));
      last_ok = Clock::now();
      renewed_at_ = sent.time_since_epoch().count();
      failing_ = false;
    } catch (const LeaseEnded& e) {
      ended = true;
      why = e.what();
    } catch (const std::exception& e) {
      ended = Clock::now() - last_ok >= patience;
      why = e.what();
      failing_ = true;
    }
    if (signal_.stopped()) return;
    if (ended) {
      ended_ = true;
      signal_.notify_end(-1, RoundEnd{RoundEnd::Kind::kPartitioned, s_.me,
                                      fmt::format("this node lost contact with {} for the keep-alive window and "
                                                  "one interval more ({} = keep_alive_interval {} x "
                                                  "(keep_alive_max_attempt {} + 1)): {}{}; {}",
                                                  s_.backend, seconds_text(patience), seconds_text(s_.interval),
                                                  s_.max_attempt, why, stopped_text(stopped, s_.interval),
                                                  going_on_without_this_node())});
      return;
    }
    // The next renewal an interval after this one was sent: one whose answer came late (a
    // partition that healed) is followed soon, as the backend counts from its arrival, but
    // not at once (a slow backend is not sent renewals back to back).
    const auto now = Clock::now();
    const auto wake_at = why.empty() ? std::max(sent + s_.interval, now + s_.interval / 4)
                                     : now + std::min<milliseconds>(s_.interval, 500ms);
    if (signal_.sleep(std::chrono::duration_cast<milliseconds>(wake_at - now))) return;
    stopped = std::max(std::chrono::duration_cast<milliseconds>(Clock::now() - wake_at), milliseconds(0));
    stalled = std::min(stopped, ttl());
  }
}

}  // namespace ddprun::rdzv::detail
