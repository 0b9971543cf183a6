// FileStore: a ddp::Store kept as files in one directory, for ranks forked by a test or by
// `ddp-bench --spawn` before ddprun's store exists. Not part of libddp: good enough for
// bootstrap (a handful of keys), not for speed. Keys become file names ('/' escaped);
// set() is atomic (write + rename); add()/compare_set() hold an flock on ".lock".
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddp/error.hpp"
#include "ddp/store.hpp"

namespace ddp_testing {

class FileStore : public ddp::Store {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {
    std::filesystem::create_directories(dir_);
  }

  void set(const std::string& key, const std::string& value) override {
    static std::atomic<unsigned> counter{0};
    std::string tmp = dir_ + "/.tmp." + std::to_string(getpid()) + "." + std::to_string(counter++);
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f.write(value.data(), static_cast<std::streamsize>(value.size()));
      if (!f) throw ddp::StoreError("FileStore: cannot write " + tmp);
    }
    if (std::rename(tmp.c_str(), path(key).c_str()) != 0)
      throw ddp::SystemError("FileStore: rename to " + path(key), errno);
  }
  std::string get(const std::string& key) override {
    wait({key}, timeout());
    return read(key);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    Lock l(dir_);
    int64_t v = exists(key) ? std::stoll(read(key)) : 0;
    v += delta;
    set(key, std::to_string(v));
    return v;
  }
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    Lock l(dir_);
    if (!exists(key)) {
      if (!expected.empty()) return expected;
      set(key, desired);
      return desired;
    }
    std::string cur = read(key);
    if (cur != expected) return cur;
    set(key, desired);
    return desired;
  }
  bool check(const std::vector<std::string>& keys) override {
    for (auto& k : keys)
      if (!exists(k)) return false;
    return true;
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    auto sleep = std::chrono::microseconds(100);
    while (!check(keys)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        std::string missing;
        for (auto& k : keys)
          if (!exists(k)) missing += (missing.empty() ? "" : ", ") + k;
        throw ddp::TimeoutError("FileStore " + dir_ + ": keys not set within " +
                                ddp::format_duration(timeout) + ": " + missing);
      }
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(2000));
    }
  }
  using Store::wait;
  bool delete_key(const std::string& key) override { return ::unlink(path(key).c_str()) == 0; }
  int64_t num_keys() override {
    int64_t n = 0;
    for (auto& e : std::filesystem::directory_iterator(dir_))
      if (e.path().filename().string()[0] != '.') ++n;
    return n;
  }

 private:
  struct Lock {
    explicit Lock(const std::string& dir) : fd(::open((dir + "/.lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600)) {
      if (fd < 0 || flock(fd, LOCK_EX) != 0) throw ddp::SystemError("FileStore: lock " + dir, errno);
    }
    ~Lock() {
      if (fd >= 0) ::close(fd);
    }
    int fd;
  };
  std::string path(const std::string& key) const {
    std::string out;
    for (char c : key) {
      if (c == '/') out += "%2F";
      else if (c == '%') out += "%25";
      else out += c;
    }
    return dir_ + "/" + (out.empty() || out[0] == '.' ? "%" + out : out);
  }
  bool exists(const std::string& key) const { return ::access(path(key).c_str(), F_OK) == 0; }
  std::string read(const std::string& key) const {
    std::ifstream f(path(key), std::ios::binary);
    if (!f) throw ddp::StoreError("FileStore: cannot read key " + key);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  std::string dir_;
};

}  // namespace ddp_testing
