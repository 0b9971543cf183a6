// FileTimers (launcher/file_timer.hpp): torch's FileTimerRequest lines through a real FIFO.
// (Against torch's own client and real workers: integration/test_failure.py, FileTimerTest.)
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "launcher/file_timer.hpp"
#include "test_util.hpp"

namespace {

using ddprun::FileTimers;

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class FileTimersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    timers_ = std::make_unique<FileTimers>(
        std::map<std::string, std::string>{{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}, {"TORCHELASTIC_TIMER_FILE", path_}});
  }
  // As torch's client does: open without blocking, one line, close.
  void send(const std::string& line) {
    int fd = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK);
    ASSERT_GE(fd, 0);
    std::string l = line + "\n";
    ASSERT_EQ(::write(fd, l.data(), l.size()), static_cast<ssize_t>(l.size()));
    ::close(fd);
    timers_->on_readable();
  }
  static std::string request(int pid, const std::string& scope, double at, int sig) {
    return fmt::format(R"({{"version": 1, "pid": {}, "scope_id": "{}", "expiration_time": {:.3f}, "signal": {}}})",
                       pid, scope, at, sig);
  }
  ddprun_test::TempDir dir_;
  std::string path_ = dir_.file("timer.fifo");
  std::unique_ptr<FileTimers> timers_;
};

TEST_F(FileTimersTest, OffUnlessEnabled) {
  FileTimers off(std::map<std::string, std::string>{{"TORCHELASTIC_TIMER_FILE", dir_.file("other")}});
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(std::filesystem::exists(dir_.file("other")));
  struct stat st {};
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST_F(FileTimersTest, ArmReleaseAndExpire) {
  send(request(101, "a", now() + 60, 9));
  send(request(102, "b", now() - 1, 15));
  const auto due = timers_->next_expiry();
  ASSERT_TRUE(due);
  EXPECT_LE(*due, FileTimers::Clock::now());
  auto expired = timers_->take_expired();
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].pid, 102);
  EXPECT_EQ(expired[0].scope, "b");
  EXPECT_EQ(expired[0].signal, 15);
  EXPECT_TRUE(timers_->take_expired().empty()) << "an expired timer is disarmed";
  send(request(101, "a", -1, 0));  // released
  EXPECT_FALSE(timers_->next_expiry());
}

TEST_F(FileTimersTest, EachPidsEarliestTimerWithASignalComesOnce) {
  send(request(7, "no signal", now() - 3, 0));
  send(request(7, "late", now() - 1, 15));
  send(request(7, "early", now() - 2, 9));
  auto expired = timers_->take_expired();
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].scope, "early");
}

TEST_F(FileTimersTest, ReArmingMovesTheDeadline) {
  send(request(5, "step", now() - 1, 9));
  send(request(5, "step", now() + 60, 9));
  EXPECT_TRUE(timers_->take_expired().empty());
}

TEST_F(FileTimersTest, MalformedLinesAreSkipped) {
  send("not json");
  send(R"({"pid": "x"})");
  send(request(9, "ok", now() - 1, 9));
  EXPECT_EQ(timers_->take_expired().size(), 1u);
}

TEST_F(FileTimersTest, TheFifoGoesWithIt) {
  timers_.reset();
  EXPECT_FALSE(std::filesystem::exists(path_));
}

}  // namespace
