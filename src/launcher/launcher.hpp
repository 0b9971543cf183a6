#pragma once

#include <string>
#include <vector>

namespace ddprun {
// The whole of ddprun: parse, rendezvous, supervise, report. Returns the exit status.
// Prints "ddprun: error: ..." once and returns 2 for bad usage.
int run_main(const std::vector<std::string>& args);
}  // namespace ddprun
