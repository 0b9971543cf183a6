// The temporary folders of runs without --log-dir: <parent>/torchelastic_XXXXXX (parent is
// $TMPDIR, else /dev/shm, else /tmp), kept after a failed run for the workers' error files.
// Each run prunes the folders of older finished runs in the same parent.
//
// How a folder is known to be ddprun's and its run finished, pid reuse and pid namespaces
// notwithstanding: the run holds an flock(2) on its folder for its whole life (through a
// close-on-exec descriptor; the kernel drops the lock when the process ends, however it
// ends) and writes the marker file kRunMarker into it only once the lock is held. So a
// folder with the marker whose lock can be taken belongs to a ddprun that is gone; a locked
// one is alive; one without the marker is someone else's (torchrun's) or still being set up
// and is never touched. Nor are folders of other users, symbolic links, or anything on a
// file system without flock (the lock fails there, so no marker is written).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace ddprun {

inline constexpr const char* kRunMarker = ".ddprun-run";

// This run's folder, made in `parent` and locked until destroyed (or the process ends).
// Destroying it dates the marker: a finished run's age counts from its end.
class RunTmpDir {
 public:
  explicit RunTmpDir(const std::string& parent);  // ddp::SystemError when mkdtemp fails
  ~RunTmpDir();
  RunTmpDir(const RunTmpDir&) = delete;
  RunTmpDir& operator=(const RunTmpDir&) = delete;

  const std::string& path() const { return path_; }
  bool locked() const { return fd_ >= 0; }  // false: no marker, never pruned

 private:
  std::string path_;
  int fd_ = -1;
};

// Which finished runs' folders go: those older than max_age (by the marker's time), and
// beyond the newest `keep` whatever their age.
struct PrunePolicy {
  std::chrono::seconds max_age = std::chrono::hours(24);
  size_t keep = 10;
};

// Whether this run prunes `parent` now: one run at a time (an flock on the stamp file
// kPruneStamp there), and at most once every `every` (the stamp's time, which the run that
// prunes renews). A thousand agents that start at once on one machine (the rendezvous
// benchmark) scan the parent once, not a thousand times.
inline constexpr const char* kPruneStamp = ".ddprun-pruned";
bool prune_due(const std::string& parent, std::chrono::seconds every = std::chrono::seconds(5));

// Removes the folders of finished ddprun runs in `parent` that the policy lets go; returns
// their paths. Best effort: a folder it cannot judge or remove stays, and nothing throws.
std::vector<std::string> prune_run_tmp_dirs(const std::string& parent, const PrunePolicy& policy = {});

// The run id as it appears in a file name: '/' and a leading run of '.' become '_', so that
// the run's folder is always directly inside its parent (the id stays as given elsewhere).
std::string run_id_file_name(std::string run_id);

// A run's folders: log_root = <log_dir or a temporary root>/<run_id_file_name>_<random>; without
// --log-dir the temporary root is made and locked here (tmp_dir, tmp_root; removed after
// success by the caller) in the first usable of TMPDIR, TEMP, TMP, /tmp, /var/tmp,
// /usr/tmp, the current folder (made absolute), and /dev/shm as a last resort; older finished runs' folders beside it are pruned now and then. Throws ddp::Error
// naming a folder it cannot make.
struct RunFolders {
  std::unique_ptr<RunTmpDir> tmp_dir;
  std::string tmp_root, log_root;
};
RunFolders make_run_folders(const std::string& log_dir, const std::string& run_id);

}  // namespace ddprun
