// ddp-store-server: ddprun's TCPStore server as a standalone process (benchmarks, tests,
// or a rendezvous endpoint of its own). Prints "port=N" once listening, serves until
// SIGTERM or SIGINT.
//
//   ddp-store-server [--host H] [--port P] [--backlog N] [--log-level trace|debug|info|warn]
//
// The listen backlog is the kernel's maximum (net.core.somaxconn), or N if larger.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "store/server.hpp"

namespace {

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "ddp-store-server: %s\n"
               "usage: ddp-store-server [--host H] [--port P] [--backlog N] "
               "[--log-level trace|debug|info|warn|error]\n",
               why);
  std::exit(2);
}

long number(const char* flag, const char* text, long lo, long hi) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (!*text || *end || v < lo || v > hi) usage((std::string("bad value for ") + flag).c_str());
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  // Logs go to stderr: stdout carries only the "port=N" line.
  spdlog::set_default_logger(spdlog::stderr_color_mt("ddp-store-server"));
  ddp::detail::StoreServerOptions opt;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage((std::string(a) + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "--host") {
      opt.host = value();
    } else if (a == "--port") {
      opt.port = static_cast<uint16_t>(number("--port", value(), 0, 65535));
    } else if (a == "--backlog") {
      opt.backlog = static_cast<int>(number("--backlog", value(), 1, 1 << 20));
    } else if (a == "--log-level") {
      auto level = spdlog::level::from_str(value());
      if (level == spdlog::level::off) usage("unknown log level");
      spdlog::set_level(level);
    } else if (a == "-h" || a == "--help") {
      usage("help");
    } else {
      usage((std::string("unknown argument ") + std::string(a)).c_str());
    }
  }

  // Block the stop signals before the server thread starts, so that only sigwait sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  try {
    ddp::detail::StoreServer server(opt);
    server.start();
    std::printf("port=%u\n", static_cast<unsigned>(server.port()));
    std::fflush(stdout);
    int sig = 0;
    sigwait(&stop_signals, &sig);
    spdlog::info("ddp-store-server: signal {}, stopping", sig);
    server.stop();
  } catch (const ddp::Error& e) {
    std::fprintf(stderr, "ddp-store-server: %s\n", e.what());
    return 1;
  }
  return 0;
}
