// ddprun: a drop-in replacement for torchrun. Everything lives in the launcher library.
#include <malloc.h>

#include <string>
#include <vector>

#include "launcher/launcher.hpp"

int main(int argc, char** argv) {
  // ddprun's few threads allocate little: one malloc arena saves each of them mapping and
  // mprotecting its own (a measurable part of a launch).
  mallopt(M_ARENA_MAX, 1);
  return ddprun::run_main(std::vector<std::string>(argv + 1, argv + argc));
}
