#include "launcher/launcher.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "launcher/background.hpp"
#include "launcher/event_loop.hpp"
#include "launcher/guardian.hpp"
#include "launcher/log.hpp"
#include "launcher/net.hpp"
#include "launcher/options.hpp"
#include "launcher/process.hpp"
#include "launcher/random.hpp"
#include "launcher/report.hpp"
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

// The one line every ddprun error is: control characters (a newline in a bad value) shown
// escaped.
void print_error(const std::string& msg) {
  std::string line = "ddprun: error: ";
  for (unsigned char c : msg) {
    if (c == '\n') line += "\\n";
    else if (c == '\t') line += "\\t";
    else if (c < 0x20 || c == 0x7f) line += fmt::format("\\x{:02x}", c);
    else line += static_cast<char>(c);
  }
  line += "\n";
  ssize_t r = ::write(2, line.data(), line.size());
  (void)r;
}

// Opens the rendezvous (the store connected, this node's lease taken: calls that may wait
// out a whole timeout on a host that accepts and never answers, a frozen one) off this
// thread, which waits for a stop signal (--signals-to-handle) meanwhile. One ends the wait:
// no worker exists yet, so ddprun stops at once (`sig` set, nullptr returned; the opening
// is abandoned where it is, and ddprun must end with _Exit).
std::unique_ptr<Rendezvous> open_rendezvous(const Options& o, const std::string& host, int& sig) {
  if (!o.dynamic() && o.max_nodes == 1) return make_rendezvous(o, host);  // one node: no network
  sigset_t stops;
  sigemptyset(&stops);
  const auto triggers = StackDumps::trigger_signals(o);
  for (int s : o.stop_signals())
    if (std::find(triggers.begin(), triggers.end(), s) == triggers.end()) sigaddset(&stops, s);
  EventLoop loop;
  loop.open(stops);
  loop.serve({[&] {
                for (signalfd_siginfo si; loop.next_signal(si);)
                  if (!sig) sig = static_cast<int>(si.ssi_signo);
              },
              [] {}});
  EventLoop::OffLoop how{[&] { return sig != 0; }, [] {}, [](bool) {}, std::chrono::milliseconds(0)};
  auto opened = loop.off_loop<std::unique_ptr<Rendezvous>>([&o, host] { return make_rendezvous(o, host); }, how);
  if (!opened) return nullptr;
  // Opened in the wake-up that brought the signal, which stops this node all the same: the
  // rendezvous is left as an abandoned opening is (no round joined; its lease runs out).
  if (sig) {
    (void)opened->release();
    return nullptr;
  }
  return std::move(*opened);
}

}  // namespace

int run_main(const std::vector<std::string>& args) {
  open_closed_standard_fds();
  Options o;
  // A job is being launched (not a command line refused as parsed, as torchrun's argparse
  // exits with no record, nor --dump-stacks, run where TORCHELASTIC_ERROR_FILE is a
  // worker's): its end goes to that file.
  bool launching = false;
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
    launching = true;
    setup_logging(o.log_level);
    for (const auto& w : o.warnings) spdlog::warn("{}", w);
    for (const auto& i : o.infos) spdlog::info("{}", i);
    block_supervised_signals(o);
    // Started first, before any other thread exists (guardian.cpp: it shares ddprun's memory).
    Guardian guardian;
    guardian.start();
    if (o.standalone || (o.rdzv_id.empty() && o.max_nodes == 1)) o.rdzv_id = random_run_id();  // (as torchrun)
    const std::string host = host_name();
    int sig = 0;
    std::unique_ptr<Rendezvous> rdzv = open_rendezvous(o, host, sig);
    if (!rdzv) {
      spdlog::warn("received {} while connecting to the rendezvous (before any worker started): stopping",
                   signal_name(sig));
      write_signal_error_file(sig);
      spdlog::default_logger()->flush();
      std::fflush(nullptr);
      std::_Exit(128 + sig);  // (the thread that was opening it may still be in a call)
    }
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
    if (launching) write_launcher_error_file("UsageError", e.what());  // (the others' command line refused)
    return 2;
  } catch (const rdzv::NotNeeded& e) {
    spdlog::warn("{}", e.what());  // (shown by default: it is the node's one line about its exit 0)
    return 0;
  } catch (const std::exception& e) {
    print_error(e.what());
    if (launching) write_launcher_error_file(error_kind(e), e.what());
    return 1;
  }
}

}  // namespace ddprun
