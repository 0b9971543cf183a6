// ddprun-docgen: writes ddprun's man page and shell completions from its flag table at build
// time (not installed).
//   ddprun-docgen man VERSION SECTIONS_FILE OUT | bash OUT | zsh OUT | flags OUT
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "docs/docgen.hpp"

namespace {

int usage() {
  std::fputs("usage: ddprun-docgen man VERSION SECTIONS OUT | bash OUT | zsh OUT | flags OUT\n", stderr);
  return 2;
}

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) std::fprintf(stderr, "ddprun-docgen: cannot write %s\n", path.c_str());
  return static_cast<bool>(f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return usage();
  const std::string what = argv[1];
  std::string text;
  if (what == "man" && argc == 5) {
    std::ifstream in(argv[3], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "ddprun-docgen: cannot read %s\n", argv[3]);
      return 1;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    text = ddprun::docs::man_page(argv[2], ss.str());
  } else if (what == "bash" && argc == 3) {
    text = ddprun::docs::bash_completion();
  } else if (what == "zsh" && argc == 3) {
    text = ddprun::docs::zsh_completion();
  } else if (what == "flags" && argc == 3) {
    text = ddprun::docs::flag_list();
  } else {
    return usage();
  }
  return write_file(argv[argc - 1], text) ? 0 : 1;
}
