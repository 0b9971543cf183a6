// EventLoop::off_loop: a rendezvous call on a thread of its own while the loop reads the
// signals that stop ddprun. A signal that comes in the same wake-up as the call's end must
// stay visible to the caller (ddprun lost one there: a node frozen while it opened the
// rendezvous and thawed with SIGTERM waited out its whole join timeout).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "launcher/event_loop.hpp"

namespace {

using namespace std::chrono_literals;
using ddprun::EventLoop;

// SIGUSR1 blocked in this thread before the loop's call thread exists (it inherits the
// mask), so that a kill() of this process reaches the signalfd only.
class OffLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sigemptyset(&set_);
    sigaddset(&set_, SIGUSR1);
    ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &set_, &old_), 0);
    loop_.open(set_);
    loop_.serve({[this] {
                   for (signalfd_siginfo si; loop_.next_signal(si);) sig_ = static_cast<int>(si.ssi_signo);
                 },
                 [] {}});
    how_.stopped = [this] { return sig_ != 0; };
    how_.cancel = [this] { ++cancels_; };
    how_.waiting = [this](bool w) { waits_ += w ? 1 : 0; };
  }
  void TearDown() override {
    loop_.close();
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

  sigset_t set_{}, old_{};
  EventLoop loop_;
  EventLoop::OffLoop how_;
  int sig_ = 0;
  int cancels_ = 0;
  int waits_ = 0;
};

TEST_F(OffLoopTest, ACallThatEndsWithTheSignalKeepsItsResultAndTheSignalIsSeen) {
  // The loop first looks 200 ms after the call began: by then the call has sent the
  // signal and ended, and one wake-up brings both.
  how_.waiting = [](bool w) {
    if (w) std::this_thread::sleep_for(200ms);
  };
  auto v = loop_.off_loop<int>(
      [] {
        kill(getpid(), SIGUSR1);
        return 7;
      },
      how_);
  ASSERT_TRUE(v.has_value()) << "the call ended: its result (an opened rendezvous, a joined round) is the caller's";
  EXPECT_EQ(*v, 7);
  EXPECT_EQ(sig_, SIGUSR1) << "the signal that came with the result must not be lost";
  EXPECT_EQ(cancels_, 0);
}

TEST_F(OffLoopTest, ASignalDuringTheCallCancelsIt) {
  std::atomic<bool> cancelled{false};
  how_.cancel = [&] {
    cancelled = true;
    ++cancels_;
  };
  auto began = std::chrono::steady_clock::now();
  auto v = loop_.off_loop<int>(
      [&cancelled] {
        kill(getpid(), SIGUSR1);
        while (!cancelled) std::this_thread::sleep_for(1ms);  // a call that waits until cancelled
        return 7;
      },
      how_);
  EXPECT_FALSE(v.has_value());
  EXPECT_EQ(sig_, SIGUSR1);
  EXPECT_EQ(cancels_, 1);
  EXPECT_LT(std::chrono::steady_clock::now() - began, 1500ms);
}

TEST_F(OffLoopTest, NoCallStartsOnceASignalCame) {
  sig_ = SIGTERM;  // read before this call (a signal while the last answer came)
  bool ran = false;
  auto v = loop_.off_loop<int>(
      [&ran] {
        ran = true;
        return 7;
      },
      how_);
  EXPECT_FALSE(v.has_value());
  EXPECT_FALSE(ran) << "a join must not begin after the signal that stops the node";
  EXPECT_EQ(waits_, 0);
  EXPECT_EQ(cancels_, 0);
}

TEST_F(OffLoopTest, ACallWithoutASignalReturnsItsResult) {
  auto v = loop_.off_loop<int>([] { return 7; }, how_);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(*v, 7);
  EXPECT_EQ(sig_, 0);
  EXPECT_EQ(waits_, 1);
}

}  // namespace
