// The man page ddprun(1) and the bash and zsh completions, generated from the flag table
// (launcher/flags.hpp) that --help prints, so none of them can drift from the parser.
#pragma once

#include <string>

namespace ddprun::docs {

// roff: the generated NAME, SYNOPSIS, DESCRIPTION and OPTIONS, then `sections` (hand-written
// roff for what --help cannot say: environment, exit status, signals, files, examples).
std::string man_page(const std::string& version, const std::string& sections);

// A bash completion script defining _ddprun (standalone: no bash-completion helpers needed).
std::string bash_completion();

// A zsh completion function (#compdef ddprun) built on _arguments.
std::string zsh_completion();

// One line per flag: "--name<TAB>-s or -<TAB>value|flag<TAB>choices" (for tests).
std::string flag_list();

}  // namespace ddprun::docs
