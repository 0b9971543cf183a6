// Drives ddp::TcpStore (wire generation 1 by default) through every Store operation and prints one line per
// result. test_torch_client.py runs it against PyTorch's own TCPStore server and against
// ddp-store-server and compares the outputs.
//
//   store_client_check HOST PORT [1|2|auto]
// With auto (WireGeneration::kAuto) it ends with "generation: N", the one it found.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "ddp/error.hpp"
#include "ddp/tcp_store.hpp"
#include "test_timeouts.hpp"

using namespace std::chrono_literals;
using ddp::test::scaled;

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: store_client_check HOST PORT [1|2|auto]\n");
    return 2;
  }
  ddp::TcpStoreOptions o;
  o.host = argv[1];
  o.port = static_cast<uint16_t>(std::atoi(argv[2]));
  const std::string gen = argc == 4 ? argv[3] : "1";
  const std::string P = gen == "auto" ? "cpp-auto/" : "cpp/";  // keys of its own: one server, two runs
  o.generation = gen == "2" ? ddp::WireGeneration::kV2 : gen == "auto" ? ddp::WireGeneration::kAuto : ddp::WireGeneration::kV1;
  o.timeout = scaled(30s);  // hang guards
  o.connect_timeout = scaled(30s);
  auto line = [](const std::string& s) { std::printf("%s\n", s.c_str()); };
  try {
    ddp::TcpStore a(o), b(o);
    int64_t n0 = a.num_keys();
    a.set((P + "k"), std::string("v\0al", 4));
    line(fmt::format("get: {}", a.get((P + "k")) == std::string("v\0al", 4)));
    // One statement per call: function arguments are evaluated in an unspecified order.
    auto add1 = a.add((P + "n"), 5);
    auto add2 = b.add((P + "n"), -2);
    line(fmt::format("add: {} {} {}", add1, add2, a.get((P + "n"))));
    auto cas1 = a.compare_set((P + "c"), "exp", "des");
    auto cas2 = a.compare_set((P + "c"), "", "des");
    auto cas3 = a.compare_set((P + "c"), "nope", "x");
    auto cas4 = a.compare_set((P + "c"), "des", "x");
    line(fmt::format("compare_set: {} {} {} {} {}", cas1, cas2, cas3, cas4, b.get((P + "c"))));
    auto check1 = a.check({(P + "k"), (P + "n")});
    line(fmt::format("check: {} {}", check1, a.check({(P + "k"), (P + "zz")})));
    auto t0 = std::chrono::steady_clock::now();  // before the SET can happen, however slow
    auto fut = std::async(std::launch::async, [&] {
      std::this_thread::sleep_for(200ms);
      b.set((P + "w"), "1");
    });
    a.wait({(P + "w")}, scaled(60s));
    auto dt = std::chrono::steady_clock::now() - t0;
    fut.get();
    // Woken by the SET ~200 ms in, not at the timeout: the upper bound is far from both.
    line(fmt::format("wait-woken: {}", dt > 100ms && dt < scaled(10s)));
    try {
      a.wait({(P + "w"), (P + "never")}, 300ms);
      line("wait-timeout: no exception");
    } catch (const ddp::TimeoutError& e) {
      line(fmt::format("wait-timeout: TimeoutError names key: {}",
                       std::string(e.what()).find("'" + P + "never'") != std::string::npos));
    }
    // The timed-out client keeps working, with no stray byte in its stream. Once b reads
    // the key back, the server has handled the SET and sent any stray byte.
    b.set((P + "never"), "now");
    (void)b.get((P + "never"));
    auto size_k = a.get((P + "k")).size();
    line(fmt::format("after-timeout: {} {}", size_k, a.add((P + "n"), 1)));

    auto del1 = a.delete_key((P + "c"));
    line(fmt::format("delete: {} {}", del1, a.delete_key((P + "c"))));
    line(fmt::format("num_keys: {}", a.num_keys() - n0));
    std::string big(1 << 20, 'B');
    a.set((P + "big"), big);
    line(fmt::format("big: {}", b.get((P + "big")) == big));
    if (gen == "auto") line(fmt::format("generation: {}", a.generation() == ddp::WireGeneration::kV1 ? 1 : 2));
  } catch (const std::exception& e) {
    line(fmt::format("error: {}", e.what()));
    return 1;
  }
  return 0;
}
