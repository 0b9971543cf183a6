#include "launcher/file_timer.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "launcher/random.hpp"

namespace ddprun {

namespace {

std::string get(const std::map<std::string, std::string>& env, const char* k) {
  auto it = env.find(k);
  return it == env.end() ? "" : it->second;
}

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

FileTimers::FileTimers(const std::map<std::string, std::string>& env) {
  if (get(env, "TORCHELASTIC_ENABLE_FILE_TIMER") != "1") return;
  path_ = get(env, "TORCHELASTIC_TIMER_FILE");
  if (path_.empty()) {
    std::string tmp = get(env, "TMPDIR");
    path_ = fmt::format("{}/watchdog_timer_{:016x}", tmp.empty() ? "/tmp" : tmp, random_u64());
  }
  ::unlink(path_.c_str());
  if (mkfifo(path_.c_str(), 0600) != 0)
    throw ddp::SystemError(fmt::format("TORCHELASTIC_ENABLE_FILE_TIMER=1: cannot make the timer FIFO {}", path_),
                           errno);
  read_fd_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (read_fd_ >= 0) write_fd_ = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (read_fd_ < 0 || write_fd_ < 0) {
    const int err = errno;
    close_all();
    throw ddp::SystemError(fmt::format("TORCHELASTIC_ENABLE_FILE_TIMER=1: cannot open the timer FIFO {}", path_),
                           err);
  }
}

FileTimers::~FileTimers() { close_all(); }

void FileTimers::close_all() {
  for (int* fd : {&read_fd_, &write_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  if (!path_.empty()) ::unlink(path_.c_str());
  path_.clear();
}

void FileTimers::on_readable() {
  if (read_fd_ < 0) return;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(read_fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EAGAIN: all read (write_fd_ keeps the FIFO from ending)
    partial_.append(buf, static_cast<size_t>(n));
  }
  for (size_t nl; (nl = partial_.find('\n')) != std::string::npos;) {
    request(partial_.substr(0, nl));
    partial_.erase(0, nl + 1);
  }
  if (partial_.size() > 64 * 1024) partial_.clear();  // no client writes a line this long (PIPE_BUF)
}

// {"version": 1, "pid": P, "scope_id": S, "expiration_time": T, "signal": N}; T < 0 releases.
void FileTimers::request(const std::string& line) {
  Timer t;
  try {
    auto j = nlohmann::json::parse(line);
    t.pid = j.at("pid").get<pid_t>();
    t.scope = j.at("scope_id").is_string() ? j.at("scope_id").get<std::string>() : j.at("scope_id").dump();
    t.expires_at = j.at("expiration_time").get<double>();
    t.signal = j.value("signal", 0);
    if (t.pid <= 0 || !std::isfinite(t.expires_at)) throw std::invalid_argument("no pid or time");
  } catch (const std::exception& e) {
    if (!said_malformed_)
      spdlog::warn("TORCHELASTIC_TIMER_FILE {}: a request that is not torch's FileTimerRequest was skipped: {}",
                   path_, e.what());
    said_malformed_ = true;
    return;
  }
  auto key = std::make_pair(t.pid, t.scope);
  if (t.expires_at < 0) timers_.erase(key);
  else timers_[key] = std::move(t);
}

std::optional<FileTimers::Clock::time_point> FileTimers::next_expiry() const {
  if (timers_.empty()) return std::nullopt;
  double first = timers_.begin()->second.expires_at;
  for (auto& [k, t] : timers_) first = std::min(first, t.expires_at);
  const double in = std::clamp(first - wall_now(), 0.0, 86400.0);
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(in));
}

std::vector<FileTimers::Timer> FileTimers::take_expired() {
  const double now = wall_now();
  std::map<pid_t, Timer> first;  // each pid's earliest expired timer with a signal (else its earliest)
  for (auto it = timers_.begin(); it != timers_.end();) {
    const Timer& t = it->second;
    if (t.expires_at > now) {
      ++it;
      continue;
    }
    auto [at, fresh] = first.try_emplace(t.pid, t);
    const bool better = (t.signal > 0) > (at->second.signal > 0) ||
                        ((t.signal > 0) == (at->second.signal > 0) && t.expires_at < at->second.expires_at);
    if (!fresh && better) at->second = t;
    it = timers_.erase(it);
  }
  std::vector<Timer> out;
  for (auto& [pid, t] : first) {
    t.late = std::max(0.0, now - t.expires_at);
    out.push_back(std::move(t));
  }
  return out;
}


}  // namespace ddprun
