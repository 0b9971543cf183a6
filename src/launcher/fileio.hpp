// Whole-file reads and writes through close-on-exec descriptors. ddprun opens nothing a
// worker could inherit (std::fstream has no O_CLOEXEC); tests/launcher/integration/test_fds.py.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun {

// The file's bytes (its first max_bytes at most), or nullopt (errno set) when it cannot be
// opened or read.
std::optional<std::string> read_file(const std::string& path, size_t max_bytes = SIZE_MAX);

// Creates or truncates path and writes data; false (errno set) on any failure.
bool write_file(const std::string& path, std::string_view data);

}  // namespace ddprun
