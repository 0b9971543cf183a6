#include "launcher/launcher.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "launcher/background.hpp"
#include "launcher/log.hpp"
#include "launcher/options.hpp"
#include "launcher/process.hpp"
#include "launcher/random.hpp"
#include "launcher/rendezvous.hpp"
#include "launcher/stack_dump.hpp"
#include "rendezvous/backend.hpp"
#include "launcher/supervisor.hpp"
#include "launcher/version.hpp"

namespace ddprun {

namespace {

std::string random_run_id() {
  uint64_t a = random_u64(), b = random_u64();
  return fmt::format("{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}", a >> 32, (a >> 16) & 0xffff, a & 0xfff,
                     0x8000 | (b >> 48 & 0x3fff), b & 0xffffffffffffULL);
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

void print_error(const std::string& msg) {
  std::string line = "ddprun: error: " + msg + "\n";
  ssize_t r = ::write(2, line.data(), line.size());
  (void)r;
}

}  // namespace

int run_main(const std::vector<std::string>& args) {
  Options o;
  try {
    auto env = current_environment();
    o = parse_options(args, env);
    if (o.help) {
      fmt::print("{}", o.help_text);
      return 0;
    }
    if (o.version) {
      fmt::print("ddprun {} (commit {})\n", version(), git_commit());
      return 0;
    }
    if (o.dump_stacks >= 0) return dump_stacks_command(o.dump_stacks);
    setup_logging(o.log_level);
    for (const auto& w : o.warnings) spdlog::warn("{}", w);
    for (const auto& i : o.infos) spdlog::info("{}", i);
    block_supervised_signals(o);
    // Forked first, while ddprun is small and has no other thread: cheap, and the only
    // moment a fork of a multithreaded process is avoided entirely.
    Guardian guardian;
    guardian.start();
    if (o.standalone) o.rdzv_id = random_run_id();
    const std::string host = host_name();
    std::unique_ptr<Rendezvous> rdzv = make_rendezvous(o, host);
    if (sets_omp_threads(o, env))
      spdlog::warn(
          "OMP_NUM_THREADS is not set: setting it to 1 for each worker so that {} workers do not overload the "
          "machine; tune it for your application",
          o.nproc_per_node);
    Supervisor sup(o, env, guardian, *rdzv, host);
    JobOutcome outcome = sup.run();
    // A goodbye to the rendezvous given up at its deadline may still run on a thread of
    // its own, using objects that the destructors below would free: end here.
    if (abandoned_anything()) {
      spdlog::default_logger()->flush();
      std::fflush(nullptr);
      std::_Exit(outcome.exit_code);
    }
    return outcome.exit_code;
  } catch (const ddp::UsageError& e) {
    print_error(e.what());
    return 2;
  } catch (const rdzv::NotNeeded& e) {
    spdlog::info("{}", e.what());
    return 0;
  } catch (const std::exception& e) {
    print_error(e.what());
    return 1;
  }
}

}  // namespace ddprun
