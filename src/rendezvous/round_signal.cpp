#include "rendezvous/round_signal.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <utility>

#include "ddp/error.hpp"

namespace ddprun::rdzv::detail {

RoundSignal::RoundSignal() {
  efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd_ < 0) throw ddp::SystemError("eventfd", errno);
}

RoundSignal::~RoundSignal() {
  if (efd_ >= 0) ::close(efd_);
}

void RoundSignal::wake() {
  uint64_t one = 1;
  ssize_t n = ::write(efd_, &one, sizeof one);
  (void)n;
}

void RoundSignal::watch(int64_t round, Members members) {
  {
    std::lock_guard lk(mu_);
    round_ = round;
    members_ = std::move(members);
    end_.reset();
  }
  cv_.notify_all();
}

int64_t RoundSignal::watched() const {
  std::lock_guard lk(mu_);
  return round_;
}

std::optional<RoundEnd> RoundSignal::take() {
  uint64_t v;
  while (::read(efd_, &v, sizeof v) == sizeof v) {
  }
  std::lock_guard lk(mu_);
  if (problem_) return problem_;
  return end_;
}

void RoundSignal::rearm() {
  bool pending = false;
  {
    std::lock_guard lk(mu_);
    pending = problem_ || end_ || !dumps_.empty() || !answers_.empty();
  }
  if (pending) wake();
}

RoundEnd RoundSignal::wait() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return problem_ || end_ || stop_; });
  if (problem_) return *problem_;
  if (end_) return *end_;
  return RoundEnd{RoundEnd::Kind::kClosed, "", "stopping"};
}

std::optional<RoundEnd> RoundSignal::cut_off() const {
  std::lock_guard lk(mu_);
  return problem_;
}

std::vector<std::string> RoundSignal::take_dumps() {
  std::lock_guard lk(mu_);
  return std::exchange(dumps_, {});
}

std::vector<DumpAnswers> RoundSignal::take_answers() {
  std::lock_guard lk(mu_);
  return std::exchange(answers_, {});
}

int64_t RoundSignal::dump_round(const std::string& what) const {
  std::lock_guard lk(mu_);
  for (auto it = asked_in_.rbegin(); it != asked_in_.rend(); ++it)
    if (it->first == what) return it->second;
  return -1;
}

void RoundSignal::stop() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
}

bool RoundSignal::stopped() const {
  std::lock_guard lk(mu_);
  return stop_;
}

void RoundSignal::notify_end(int64_t round, const RoundEnd& end) {
  {
    std::lock_guard lk(mu_);
    if (round >= 0 && (round_ != round || end_)) return;
    if (round < 0) {
      if (problem_) return;
      problem_ = end;
    } else {
      end_ = end;
    }
  }
  cv_.notify_all();
  wake();
}

void RoundSignal::add_dumps(int64_t round, const std::vector<std::string>& asked) {
  if (asked.empty()) return;
  {
    std::lock_guard lk(mu_);
    dumps_.insert(dumps_.end(), asked.begin(), asked.end());
    for (const auto& what : asked) asked_in_.emplace_back(what, round);
    while (asked_in_.size() > 16) asked_in_.pop_front();
  }
  wake();
}

void RoundSignal::add_answers(DumpAnswers got) {
  {
    std::lock_guard lk(mu_);
    answers_.push_back(std::move(got));
  }
  wake();
}

std::optional<RoundSignal::Watch> RoundSignal::await(int64_t r) {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return stop_ || !quiet(r); });
  if (stop_) return std::nullopt;
  return Watch{round_, members_};
}

bool RoundSignal::idle(int64_t r) const {
  std::lock_guard lk(mu_);
  return quiet(r);
}

bool RoundSignal::ended(int64_t r) const {
  std::lock_guard lk(mu_);
  return round_ == r && end_.has_value();
}

bool RoundSignal::sleep(std::chrono::milliseconds d) {
  std::unique_lock lk(mu_);
  return cv_.wait_for(lk, d, [&] { return stop_; });
}

void RoundSignal::until_stopped() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return stop_; });
}

}  // namespace ddprun::rdzv::detail
