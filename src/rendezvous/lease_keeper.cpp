#include "rendezvous/lease_keeper.hpp"

#include <spdlog/spdlog.h>

#include "rendezvous/dynamic_util.hpp"

namespace ddprun::rdzv::detail {

LeaseKeeper::LeaseKeeper(std::unique_ptr<Backend> lease, Settings s, RoundSignal& signal)
    : lease_(std::move(lease)), s_(std::move(s)), signal_(signal) {
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

void LeaseKeeper::release() {
  std::lock_guard lk(mu_);
  spdlog::debug("rendezvous: releasing");
  lease_->release();
}

// A lease that ended (the backend said so, or no renewal got through for the whole
// window) means the others go on without this node: it must stop.
void LeaseKeeper::loop() {
  auto last_ok = Clock::now();
  while (!signal_.stopped()) {
    auto left = std::chrono::duration_cast<milliseconds>(ttl() - (Clock::now() - last_ok));
    bool ended = false;
    std::string why;
    try {
      std::lock_guard lk(mu_);
      lease_->keep_alive(std::max(left, 100ms));
      last_ok = Clock::now();
    } catch (const LeaseEnded& e) {
      ended = true;
      why = e.what();
    } catch (const std::exception& e) {
      ended = Clock::now() - last_ok >= ttl();
      why = e.what();
    }
    if (signal_.stopped()) return;
    if (ended) {
      signal_.notify_end(-1, RoundEnd{RoundEnd::Kind::kPartitioned, s_.me,
                                      fmt::format("this node lost contact with {} for the keep-alive window ({} = "
                                                  "keep_alive_interval {} x keep_alive_max_attempt {}): {}; the "
                                                  "other nodes go on without it",
                                                  s_.backend, seconds_text(ttl()), seconds_text(s_.interval),
                                                  s_.max_attempt, why)});
      return;
    }
    if (signal_.sleep(why.empty() ? s_.interval : std::min<milliseconds>(s_.interval, 500ms))) return;
  }
}

}  // namespace ddprun::rdzv::detail
