// ddprun: a drop-in replacement for torchrun. Everything lives in the launcher library.
#include <string>
#include <vector>

#include "launcher/launcher.hpp"

int main(int argc, char** argv) { return ddprun::run_main(std::vector<std::string>(argv + 1, argv + argc)); }
