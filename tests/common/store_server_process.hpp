// A ddp-store-server in a process of its own, for tests that stop it (SIGSTOP), continue
// it, kill it or start it again on its port, always by the pid they started. The test
// target defines DDP_STORE_SERVER (the binary's path) and depends on ddp-store-server.
// Start it before the test process has threads: the child of a multi-threaded process may
// only exec, which is all it does.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>

namespace ddp::test {

struct StoreServerProcess {
  pid_t pid = -1;
  int port = 0;

  StoreServerProcess() = default;
  StoreServerProcess(const StoreServerProcess&) = delete;
  StoreServerProcess& operator=(const StoreServerProcess&) = delete;
  ~StoreServerProcess() { kill(); }

  // Listens on 127.0.0.1:want_port (0: any); returns once it said its port.
  void start(int want_port = 0) {
    int out[2];
    if (::pipe(out) != 0) throw std::runtime_error("pipe");
    pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork");
    if (pid == 0) {
      ::dup2(out[1], 1);
      ::close(out[0]);
      ::close(out[1]);
      std::string p = std::to_string(want_port);
      ::execl(DDP_STORE_SERVER, DDP_STORE_SERVER, "--host", "127.0.0.1", "--port", p.c_str(), "--log-level", "warn",
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(out[1]);
    std::string text;
    char buf[64];
    ssize_t n;
    while (text.find('\n') == std::string::npos && (n = ::read(out[0], buf, sizeof buf)) > 0) text.append(buf, n);
    ::close(out[0]);
    if (text.rfind("port=", 0) != 0) throw std::runtime_error("ddp-store-server did not start: " + text);
    port = std::stoi(text.substr(5));
  }
  void kill() {
    if (pid <= 0) return;
    ::kill(pid, SIGCONT);
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
  // SIGSTOP takes effect a moment after kill() returns: waits until the server is stopped.
  void freeze() {
    ::kill(pid, SIGSTOP);
    const std::string stat = "/proc/" + std::to_string(pid) + "/stat";
    for (int i = 0; i < 1000; ++i) {
      std::ifstream f(stat);
      std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      size_t paren = text.rfind(')');
      if (paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'T') return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  void thaw() { ::kill(pid, SIGCONT); }
};

}  // namespace ddp::test
