// ddprun's flag table: torchrun 2.x's flags followed by ddprun's own. One table feeds the
// parser, --help, the man page and the shell completions (they cannot drift apart).
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace ddprun {

enum class FlagKind { kValue, kFlag };

struct FlagSpec {
  const char* name;         // canonical long name, dashes
  char short_name;          // 0 if none
  FlagKind kind;
  const char* def;          // default shown in --help ("" = none)
  const char* group;        // --help section
  const char* help;         // one line
  const char* extra_env = nullptr;  // another environment fallback after PET_<NAME>
  const char* choices = nullptr;    // space-separated values for completion ("" = free)
  const char* metavar = "VALUE";    // what the value is: VALUE, FILE, DIR, N, SECONDS
  bool pet = true;                  // falls back to PET_<NAME> (not a sub-command's flag)
};

// Every flag, in --help order.
std::span<const FlagSpec> flag_table();

// Exact canonical name (dashes) or nullptr.
const FlagSpec* find_flag(std::string_view name);

// argparse's rules: underscores equal dashes, an unambiguous prefix selects its flag.
// Throws ddp::UsageError for an unknown or ambiguous name.
const FlagSpec& lookup_long_flag(const std::string& raw);

// "PET_NPROC_PER_NODE" for nproc-per-node.
std::string pet_name(const FlagSpec& f);

// The text --help prints.
std::string help_text();

}  // namespace ddprun
