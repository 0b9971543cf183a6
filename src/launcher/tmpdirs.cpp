#include "launcher/tmpdirs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <exception>
#include <filesystem>
#include <memory>
#include <string_view>
#include <tuple>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"
#include "launcher/random.hpp"

namespace ddprun {

namespace {

constexpr std::string_view kPrefix = "torchelastic_";

// A descriptor closed when it goes out of scope.
struct Fd {
  int fd = -1;
  Fd() = default;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// The marker, written once the lock is held; its text is for a person looking at the folder.
bool write_marker(int dir) {
  int fd = ::openat(dir, kRunMarker, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  const std::string text =
      fmt::format("ddprun pid {}: a later ddprun removes this folder some time after this run has ended\n", ::getpid());
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  return ::close(fd) == 0 && ok;
}

// Opens `name` in `parent` into `dir` and locks it when it is the folder of a finished
// ddprun run of this user; `ended`: its marker's time.
bool lock_finished(int parent, const char* name, Fd& dir, timespec& ended) {
  dir.fd = ::openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  if (dir.fd < 0 || ::fstat(dir.fd, &st) != 0 || st.st_uid != ::geteuid()) return false;
  if (::fstatat(dir.fd, kRunMarker, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) return false;
  if (::flock(dir.fd, LOCK_EX | LOCK_NB) != 0) return false;  // its run is alive
  if (::fstatat(dir.fd, kRunMarker, &st, AT_SYMLINK_NOFOLLOW) != 0) return false;
  ended = st.st_mtim;
  return true;
}

struct Finished {
  std::string name;
  timespec ended;
};

// The finished runs' folders in `parent`, newest first.
std::vector<Finished> finished_runs(DIR* d) {
  std::vector<Finished> out;
  while (const dirent* e = ::readdir(d)) {
    std::string_view name(e->d_name);
    if (name.substr(0, kPrefix.size()) != kPrefix || (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN)) continue;
    Fd dir;
    timespec ended{};
    if (lock_finished(::dirfd(d), e->d_name, dir, ended)) out.push_back({e->d_name, ended});
  }
  std::sort(out.begin(), out.end(), [](const Finished& a, const Finished& b) {
    return std::tie(a.ended.tv_sec, a.ended.tv_nsec) > std::tie(b.ended.tv_sec, b.ended.tv_nsec);
  });
  return out;
}

// Removes a finished run's folder, checked again under its lock (another ddprun may be
// pruning the same parent).
bool remove_finished(DIR* d, const std::string& parent, const std::string& name) {
  Fd dir;
  timespec ended{};
  if (!lock_finished(::dirfd(d), name.c_str(), dir, ended)) return false;
  std::error_code ec;
  std::filesystem::remove_all(parent + "/" + name, ec);
  if (ec) spdlog::debug("could not remove {}/{}: {}", parent, name, ec.message());
  return !ec;
}

}  // namespace

RunTmpDir::RunTmpDir(const std::string& parent) {
  std::string tmpl = parent + "/" + std::string(kPrefix) + "XXXXXX";
  if (!::mkdtemp(tmpl.data())) throw ddp::SystemError("create a temporary folder for error files", errno);
  path_ = tmpl;
  int fd = ::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0 && write_marker(fd)) {
    fd_ = fd;
    return;
  }
  spdlog::debug("{}: no lock or marker ({}): later runs leave it alone", path_, ddp::errno_text(errno));
  if (fd >= 0) ::close(fd);
}

RunTmpDir::~RunTmpDir() {
  if (fd_ < 0) return;
  ::utimensat(fd_, kRunMarker, nullptr, AT_SYMLINK_NOFOLLOW);  // the run's end (none left after a success that kept no logs)
  ::close(fd_);
}

bool prune_due(const std::string& parent, std::chrono::seconds every) {
  const std::string stamp = parent + "/" + kPruneStamp;
  int fd = ::open(stamp.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return false;
  bool due = false;
  struct stat st;
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::fstat(fd, &st) == 0 && st.st_uid == ::geteuid()) {
    // A new stamp is empty: due. Else by its time.
    due = st.st_size == 0 || ::time(nullptr) - st.st_mtime >= every.count();
    if (due) {
      ssize_t w = ::pwrite(fd, "1", 1, 0);
      (void)w;
      ::futimens(fd, nullptr);
    }
  }
  ::close(fd);  // and its lock
  return due;
}

std::vector<std::string> prune_run_tmp_dirs(const std::string& parent, const PrunePolicy& policy) {
  std::vector<std::string> removed;
  try {
    std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(parent.c_str()), ::closedir);
    if (!d) return removed;
    const std::vector<Finished> runs = finished_runs(d.get());
    const time_t now = ::time(nullptr);
    for (size_t i = 0; i < runs.size(); ++i) {
      const bool young = now - runs[i].ended.tv_sec <= policy.max_age.count();
      if (i < policy.keep && young) continue;
      if (remove_finished(d.get(), parent, runs[i].name)) removed.push_back(parent + "/" + runs[i].name);
    }
    for (const auto& p : removed) spdlog::debug("removed {}, the folder of a finished run", p);
  } catch (const std::exception& e) {
    spdlog::debug("pruning old run folders in {}: {}", parent, e.what());
  }
  return removed;
}

namespace {

std::string random_suffix() {
  static const char* alphabet = "abcdefghijklmnopqrstuvwxyz0123456789_";
  uint64_t r = random_u64();
  std::string s;
  for (int i = 0; i < 8; ++i, r /= 37) s += alphabet[r % 37];
  return s;
}

}  // namespace

std::string run_id_file_name(std::string run_id) {
  std::replace(run_id.begin(), run_id.end(), '/', '_');
  for (char& c : run_id) {
    if (c != '.') break;
    c = '_';
  }
  return run_id;
}

namespace {

// `p` made absolute (as Python's tempfile and torchrun 2.x make theirs): the workers get
// paths under it (their error files, heartbeats, stacks), and a worker that changes its
// directory (Hydra's run folders) must still find them. `p` as it is when it cannot be.
std::string absolute_path(const std::string& p) {
  std::error_code ec;
  auto a = std::filesystem::absolute(p, ec);
  if (ec) return p;
  std::string out = a.lexically_normal().string();
  if (out.size() > 1 && out.back() == '/') out.pop_back();  // "logs/": no "//" below it
  return out;
}

// The parents a run's temporary root may go in, in order, as Python's tempfile (torchrun's
// mkdtemp): $TMPDIR, $TEMP, $TMP, /tmp, /var/tmp, /usr/tmp and the current folder; then, where
// Python would give up, /dev/shm, with a warning (a read-only root file system, as
// Kubernetes' readOnlyRootFilesystem, ran with it). /dev/shm came first once, for 1 ms of a
// launch: a container's is 64 MB that NCCL and DataLoader workers fill, and then torch's
// @record could not write the worker's error file, and the summary showed its OSError
// instead; nor can a stopped container's be copied out. Each with whether the environment
// named it.
constexpr const char* kLastResort = "/dev/shm";

std::vector<std::pair<std::string, bool>> tmp_parents() {
  std::vector<std::pair<std::string, bool>> out;
  std::error_code ec;
  for (const char* var : {"TMPDIR", "TEMP", "TMP"})
    if (const char* v = getenv(var); v && *v) out.emplace_back(absolute_path(v), true);
  for (const char* d : {"/tmp", "/var/tmp", "/usr/tmp"}) out.emplace_back(d, false);
  if (auto cwd = std::filesystem::current_path(ec); !ec) out.emplace_back(cwd.string(), false);
  out.emplace_back(kLastResort, false);
  return out;
}

// A run's temporary root in the first parent where one can be made; a warning when the
// environment named one that could not be used (Python falls back silently).
std::unique_ptr<RunTmpDir> make_tmp_root(std::string& parent) {
  std::string tried;
  bool named = false;  // a folder the environment named was passed over
  for (const auto& [dir, from_env] : tmp_parents()) {
    try {
      auto root = std::make_unique<RunTmpDir>(dir);
      if (dir == kLastResort)
        spdlog::warn("no folder can be made in {}: the run's temporary files go to {}, in memory (TMPDIR or "
                     "--log-dir names a folder on disk)",
                     tried, dir);
      else if (named)
        spdlog::warn("no folder can be made in {}: the run's temporary files go to {}", tried, dir);
      parent = dir;
      return root;
    } catch (const ddp::SystemError& e) {
      tried += (tried.empty() ? "" : ", ") + fmt::format("{} ({})", dir, ddp::errno_text(e.code()));
      named = named || from_env;
    }
  }
  throw ddp::Error(fmt::format("cannot create a temporary folder for the run's error files in any of {} "
                               "(set TMPDIR to a writable folder, or give --log-dir)",
                               tried));
}

}  // namespace

RunFolders make_run_folders(const std::string& log_dir, const std::string& run_id) {
  RunFolders f;
  std::string base = log_dir.empty() ? "" : absolute_path(log_dir);
  if (base.empty()) {
    std::string dir;
    f.tmp_dir = make_tmp_root(dir);
    f.tmp_root = base = f.tmp_dir->path();
    if (prune_due(dir)) prune_run_tmp_dirs(dir);  // older finished runs' folders (README, "Using it")
  }
  f.log_root = base + "/" + run_id_file_name(run_id) + "_" + random_suffix();
  std::error_code ec;
  std::filesystem::create_directories(f.log_root, ec);
  if (ec)
    throw ddp::Error(fmt::format("{}cannot create the run's folder {}: {}", log_dir.empty() ? "" : "--log-dir: ",
                                 f.log_root, ec.message()));
  return f;
}

}  // namespace ddprun
