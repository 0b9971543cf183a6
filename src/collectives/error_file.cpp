// torch's error-file format (torch.distributed.elastic.multiprocessing.errors).
#include "ddp/error_file.hpp"

#include <cxxabi.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <typeinfo>

#include <fmt/format.h>

#include "ddp/error.hpp"

namespace ddp {
namespace {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20)
          out += fmt::format("\\u{:04x}", c);
        else
          out += static_cast<char>(c);  // UTF-8 passes through
    }
  }
  return out + "\"";
}

}  // namespace

std::string error_file_json(const std::string& exc_type, const std::string& message,
                            const std::string& details, long long timestamp_s) {
  return fmt::format(
      "{{\"message\": {{\"message\": {}, \"extraInfo\": {{\"py_callstack\": {}, \"timestamp\": "
      "{}}}}}}}",
      json_string(exc_type + ": " + message), json_string(details),
      json_string(std::to_string(timestamp_s)));
}

bool write_error_file(const std::string& exc_type, const std::string& message,
                      const std::string& details, const std::string& path) {
  std::string p = path;
  if (p.empty()) {
    const char* e = std::getenv("TORCHELASTIC_ERROR_FILE");
    if (!e || !*e) return false;
    p = e;
  }
  auto now = std::chrono::duration_cast<std::chrono::seconds>(
                 std::chrono::system_clock::now().time_since_epoch())
                 .count();
  std::string doc = error_file_json(
      exc_type, message, details.empty() ? exc_type + ": " + message : details, now);
  std::FILE* f = std::fopen(p.c_str(), "we");  // e: O_CLOEXEC
  if (!f) throw SystemError(fmt::format("cannot write the error file {}", p), errno);
  bool ok = std::fwrite(doc.data(), 1, doc.size(), f) == doc.size();
  int err = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) throw SystemError(fmt::format("cannot write the error file {}", p), err ? err : EIO);
  return true;
}

std::string exception_type_name(const std::exception& e) {
  const char* mangled = typeid(e).name();
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                           std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(mangled);
}

bool write_error_file(const std::exception& e, const std::string& path) {
  std::string type = exception_type_name(e);
  std::string details = fmt::format("C++ exception of type {} (what: {})", type, e.what());
  return write_error_file(type, e.what(), details, path);
}

int run_main(const std::function<int()>& fn) noexcept {
  auto report = [](const std::string& type, const std::string& what, const std::exception* e) {
    try {
      std::cerr << type << ": " << what << std::endl;
      if (e)
        write_error_file(*e);
      else
        write_error_file(type, what);
    } catch (const std::exception& w) {
      std::cerr << "(could not write the error file: " << w.what() << ")" << std::endl;
    } catch (...) {
    }
  };
  try {
    return fn();
  } catch (const std::exception& e) {
    report(exception_type_name(e), e.what(), &e);
  } catch (...) {
    report("UnknownException", "a non-std::exception was thrown", nullptr);
  }
  return 1;
}

}  // namespace ddp
