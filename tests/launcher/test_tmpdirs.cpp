// The temporary folders of runs without --log-dir (launcher/tmpdirs.hpp): made locked and
// marked; later runs prune finished runs' folders by age and count, never a live run's or
// one ddprun did not make.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "ddp/error.hpp"
#include "launcher/tmpdirs.hpp"
#include "test_util.hpp"

namespace {

namespace fs = std::filesystem;
using ddprun::kRunMarker;
using ddprun::PrunePolicy;
using ddprun::prune_run_tmp_dirs;
using ddprun::RunTmpDir;
using std::chrono::hours;
using std::chrono::seconds;

std::string marker(const std::string& dir) { return dir + "/" + kRunMarker; }

void set_age(const std::string& path, seconds age) {
  timespec t[2];
  t[0].tv_sec = t[1].tv_sec = ::time(nullptr) - static_cast<time_t>(age.count());
  t[0].tv_nsec = t[1].tv_nsec = 0;
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), t, AT_SYMLINK_NOFOLLOW), 0) << path;
}

// The folder of a run that ended `age` ago (as a run leaves it: the marker, no lock).
std::string finished(const std::string& parent, seconds age) {
  std::string path = RunTmpDir(parent).path();
  set_age(marker(path), age);
  return path;
}

// Whether someone holds the folder's lock.
bool held(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  bool busy = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return busy;
}

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(LauncherTmpdirs, MakesALockedFolderWithTheMarker) {
  ddprun_test::TempDir parent;
  std::string path;
  {
    RunTmpDir dir(parent.path());
    path = dir.path();
    EXPECT_EQ(path.rfind(parent.path() + "/torchelastic_", 0), 0u) << path;
    struct stat st;
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    EXPECT_TRUE(dir.locked());
    EXPECT_TRUE(held(path)) << "locked while the run lives";
    EXPECT_NE(ddprun_test::read_file(marker(path)).find("ddprun pid " + std::to_string(::getpid())), std::string::npos);
  }
  EXPECT_TRUE(fs::is_directory(path)) << "kept: the error files of a failed run";
  EXPECT_FALSE(held(path)) << "unlocked once the run has ended";
}

TEST(LauncherTmpdirs, TheEndOfARunDatesItsMarker) {
  ddprun_test::TempDir parent;
  auto dir = std::make_unique<RunTmpDir>(parent.path());
  const std::string m = marker(dir->path());
  set_age(m, hours(48));
  dir.reset();
  struct stat st;
  ASSERT_EQ(::stat(m.c_str(), &st), 0);
  EXPECT_LE(::time(nullptr) - st.st_mtim.tv_sec, 60) << "a run's age counts from its end, not its start";
}

TEST(LauncherTmpdirs, FinishedFoldersOlderThanADayGo) {
  ddprun_test::TempDir parent;
  const std::string old = finished(parent.path(), hours(25));
  const std::string hour = finished(parent.path(), hours(1));
  const std::string now = finished(parent.path(), seconds(0));
  EXPECT_EQ(prune_run_tmp_dirs(parent.path()), std::vector<std::string>{old});
  EXPECT_FALSE(fs::exists(old));
  EXPECT_TRUE(fs::exists(hour));
  EXPECT_TRUE(fs::exists(now));
}

TEST(LauncherTmpdirs, OnlyTheNewestFinishedFoldersStay) {
  ddprun_test::TempDir parent;
  std::vector<std::string> dirs;  // newest first
  for (int i = 0; i < 12; ++i) dirs.push_back(finished(parent.path(), seconds(10 * (i + 1))));
  EXPECT_EQ(sorted(prune_run_tmp_dirs(parent.path())), sorted({dirs[10], dirs[11]})) << "the default keeps 10";
  EXPECT_EQ(sorted(prune_run_tmp_dirs(parent.path(), PrunePolicy{hours(24), 3})),
            sorted(std::vector<std::string>(dirs.begin() + 3, dirs.begin() + 10)));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(fs::exists(dirs[i])) << i;
}

TEST(LauncherTmpdirs, NeverALiveRunsFolder) {
  ddprun_test::TempDir parent;
  RunTmpDir live(parent.path());
  set_age(marker(live.path()), hours(48));
  EXPECT_TRUE(prune_run_tmp_dirs(parent.path(), PrunePolicy{seconds(0), 0}).empty());
  EXPECT_TRUE(fs::exists(marker(live.path())));
}

TEST(LauncherTmpdirs, AFolderOfAKilledRunIsFinished) {
  ddprun_test::TempDir parent;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    RunTmpDir dir(parent.path());
    char c = 'r';
    if (::write(ready[1], &c, 1) != 1) ::_exit(1);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  const PrunePolicy all{seconds(0), 0};
  EXPECT_TRUE(prune_run_tmp_dirs(parent.path(), all).empty()) << "its process lives";
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_EQ(prune_run_tmp_dirs(parent.path(), all).size(), 1u) << "SIGKILL released the lock";
  EXPECT_TRUE(fs::is_empty(parent.path()));
}

TEST(LauncherTmpdirs, NeverAFolderDdprunDidNotMake) {
  ddprun_test::TempDir parent, elsewhere;
  const std::string torchrun = parent.file("torchelastic_abc123");  // torchrun's: no marker
  fs::create_directories(torchrun + "/none/attempt_0/0");
  set_age(torchrun, hours(48));
  const std::string odd = parent.file("torchelastic_odd");  // a marker that is no file
  fs::create_directories(marker(odd));
  parent.write("torchelastic_file", "x");
  const std::string target = finished(elsewhere.path(), hours(48));
  fs::create_directory_symlink(target, parent.file("torchelastic_link"));
  const std::string other_name = finished(parent.path(), hours(48));
  const std::string not_prefixed = parent.file("ddprun_keep");
  fs::rename(other_name, not_prefixed);
  EXPECT_TRUE(prune_run_tmp_dirs(parent.path(), PrunePolicy{seconds(0), 0}).empty());
  for (const char* name : {"torchelastic_abc123", "torchelastic_odd", "torchelastic_file", "torchelastic_link",
                           "ddprun_keep"})
    EXPECT_TRUE(fs::exists(fs::symlink_status(parent.file(name)))) << name;
  EXPECT_TRUE(fs::exists(marker(target))) << "not through a link";
}

TEST(LauncherTmpdirs, NeverAnotherUsersFolder) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a folder to another user";
  ddprun_test::TempDir parent;
  const std::string theirs = finished(parent.path(), hours(48));
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  EXPECT_TRUE(prune_run_tmp_dirs(parent.path(), PrunePolicy{seconds(0), 0}).empty());
  EXPECT_TRUE(fs::exists(marker(theirs)));
}

// The run id is a file name's part only: '/' and a leading '.' run cannot put the run's
// folder anywhere but directly inside --log-dir (or the temporary root).
TEST(LauncherTmpdirs, TheRunsFolderIsDirectlyInsideItsParentWhateverTheId) {
  ddprun_test::TempDir dir;
  const std::string logs = dir.file("a/b/logs");  // (without the fix, '../..' stays in `dir`)
  for (const std::string id : {"../../esc", "x/y", "..", ".", "/abs", "..hidden", "job42"}) {
    SCOPED_TRACE(id);
    ddprun::RunFolders f = ddprun::make_run_folders(logs, id);
    EXPECT_EQ(fs::path(f.log_root).parent_path(), fs::path(logs));
    EXPECT_TRUE(fs::is_directory(f.log_root));
    const std::string name = fs::path(f.log_root).filename();
    EXPECT_NE(name[0], '.') << name;
  }
  EXPECT_EQ(ddprun::run_id_file_name("../../esc"), "___.._esc");
  EXPECT_EQ(ddprun::run_id_file_name("job.42"), "job.42");
}

// Without --log-dir: an unusable TMPDIR is passed over as Python's tempfile passes it over
// (torchrun runs; ddprun failed); --tee/--redirects logs never go to tmpfs (/dev/shm).
class TmpdirEnv {
 public:
  explicit TmpdirEnv(const char* value) {
    if (const char* v = getenv("TMPDIR")) saved_ = v;
    for (const char* var : {"TEMP", "TMP"})
      if (const char* v = getenv(var)) others_.emplace_back(var, v), ::unsetenv(var);
    ::setenv("TMPDIR", value, 1);
  }
  ~TmpdirEnv() {
    if (saved_) ::setenv("TMPDIR", saved_->c_str(), 1);
    else ::unsetenv("TMPDIR");
    for (auto& [var, v] : others_) ::setenv(var, v.c_str(), 1);
  }

 private:
  std::optional<std::string> saved_;
  std::vector<std::pair<const char*, std::string>> others_;
};

std::string parent_of(const ddprun::RunFolders& f) { return fs::path(f.tmp_root).parent_path().string(); }

TEST(LauncherTmpdirs, AnUnusableTmpdirIsPassedOver) {
  for (const char* bad : {"/nonexistent/ddprun-tmpdirs-test", "/proc"}) {
    SCOPED_TRACE(bad);
    TmpdirEnv env(bad);
    ddprun::RunFolders f = ddprun::make_run_folders("", "job");
    EXPECT_TRUE(fs::is_directory(f.log_root));
    EXPECT_NE(parent_of(f), bad);
    fs::remove_all(f.tmp_root);
  }
}

// As Python's tempfile (torchrun's): /tmp after the environment's, never /dev/shm (a
// container's fills up, and goes with it).
TEST(LauncherTmpdirs, TheRunsFolderGoesToTmpNotTmpfs) {
  TmpdirEnv env("/nonexistent/ddprun-tmpdirs-test");
  ddprun::RunFolders f = ddprun::make_run_folders("", "job");
  if (::access("/tmp", W_OK | X_OK) == 0) EXPECT_EQ(parent_of(f), "/tmp");
  EXPECT_TRUE(fs::is_directory(f.log_root));
  fs::remove_all(f.tmp_root);
}

TEST(LauncherTmpdirs, AMissingParentIsNoError) {
  EXPECT_TRUE(prune_run_tmp_dirs("/nonexistent/ddprun-tmpdirs-test").empty());
  EXPECT_THROW(RunTmpDir("/nonexistent/ddprun-tmpdirs-test"), ddp::SystemError);
}

}  // namespace
