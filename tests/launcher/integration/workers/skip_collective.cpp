// A libddp worker for test_stacks: every rank runs all_reduces of 4 bytes; rank SKIP skips
// number K (it writes DIR/skipped and sleeps S seconds instead), so the others wait in
// all_reduce #K while its last one is #K-1. SKIP -1: nobody skips; PAUSE: seconds between
// two all_reduces (no output meanwhile: only the collectives show progress).
//   skip_collective SKIP K S DIR [PAUSE]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <span>
#include <string>
#include <thread>

#include "ddp/ddp.hpp"

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: skip_collective SKIP K SECONDS DIR [PAUSE]\n");
    return 2;
  }
  const int skip = std::atoi(argv[1]), k = std::atoi(argv[2]);
  const double seconds = std::atof(argv[3]), pause = argc == 6 ? std::atof(argv[5]) : 0;
  ddp::ProcessGroupOptions o;
  o.timeout = std::chrono::seconds(300);
  auto pg = ddp::init_process_group_from_env(o);
  // A second thread, as a data loader would be: its stack is shown too.
  std::thread([] { std::this_thread::sleep_for(std::chrono::hours(1)); }).detach();
  float x = 1;
  for (int i = 1; i <= k; ++i) {
    if (pg->rank() == skip && i == k) {
      std::ofstream(std::string(argv[4]) + "/skipped") << i;
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
      return 0;
    }
    pg->all_reduce(std::span<float>(&x, 1));
    if (pause > 0) std::this_thread::sleep_for(std::chrono::duration<double>(pause));
  }
  return 0;
}
