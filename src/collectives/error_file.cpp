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

// The length of the well-formed UTF-8 sequence at s[i], 0 if there is none (a stray
// continuation byte, a cut sequence, an overlong form, a surrogate, past U+10FFFF).
size_t utf8_sequence(const std::string& s, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = at(i);
  if (c < 0x80) return 1;
  const size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((at(i + k) & 0xc0) != 0x80) return 0;
  const unsigned char d = at(i + 1);
  if ((c == 0xe0 && d < 0xa0) || (c == 0xed && d >= 0xa0) || (c == 0xf0 && d < 0x90) || (c == 0xf4 && d >= 0x90))
    return 0;
  return n;
}

// A JSON string: each byte that is not part of well-formed UTF-8 becomes U+FFFD (a raw byte
// made the whole file unreadable to json.load, and ddprun's summary showed no error file).
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t n = utf8_sequence(s, i);
      out += n ? s.substr(i, n) : "\\ufffd";
      i += n ? n - 1 : 0;
      continue;
    }
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
          out += static_cast<char>(c);
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
