// Helpers shared by the launcher's unit tests: a temporary folder that cleans up after
// itself, and small file utilities.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace ddprun_test {

class TempDir {
 public:
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/ddprun_launcher_test_XXXXXX";
    if (!mkdtemp(tmpl.data())) std::abort();
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

  // Writes a file under the folder and returns its path; mode 0755 makes it executable.
  std::string write(const std::string& name, const std::string& content, mode_t mode = 0644) const {
    std::string p = file(name);
    std::filesystem::create_directories(std::filesystem::path(p).parent_path());  // "a/b/c": a/b too
    {
      std::ofstream f(p, std::ios::binary | std::ios::trunc);
      f << content;
    }
    ::chmod(p.c_str(), mode);
    return p;
  }

 private:
  std::string path_;
};

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace ddprun_test
