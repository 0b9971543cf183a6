// Reporting a worker's failure to its launcher the way torch's @record decorator does:
// ddprun (like torchrun) reads $TORCHELASTIC_ERROR_FILE after a worker fails and shows its
// message in the failure summary. The file is torch's JSON:
//   {"message": {"message": "ExcType: msg",
//                "extraInfo": {"py_callstack": "<details>", "timestamp": "<epoch s>"}}}
//
//   int main(int argc, char** argv) {
//     return ddp::run_main([&] { return real_main(argc, argv); });
//   }
#pragma once

#include <exception>
#include <functional>
#include <string>

namespace ddp {

// The torch-format JSON document for an error (exc_type: e.g. "ddp::TimeoutError").
std::string error_file_json(const std::string& exc_type, const std::string& message,
                            const std::string& details, long long timestamp_s);

// Writes the error file to `path`, or to $TORCHELASTIC_ERROR_FILE when path is empty.
// Returns false (writing nothing) when there is no path; throws SystemError if the file
// cannot be written. `details` goes to extraInfo.py_callstack (default: the message).
bool write_error_file(const std::string& exc_type, const std::string& message,
                      const std::string& details = {}, const std::string& path = {});
// Same, for an exception: its demangled dynamic type and what().
bool write_error_file(const std::exception& e, const std::string& path = {});

// Demangled dynamic type of an exception ("ddp::CollectiveError", "std::runtime_error").
std::string exception_type_name(const std::exception& e);

// Runs fn; returns its result. If it throws, prints "<type>: <what>" to stderr, writes
// the error file (when $TORCHELASTIC_ERROR_FILE is set) and returns 1.
int run_main(const std::function<int()>& fn) noexcept;

}  // namespace ddp
