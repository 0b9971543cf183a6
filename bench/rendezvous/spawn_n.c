/* spawn_n N CMD ARGS...: starts N copies of CMD at once (posix_spawn, stdout and stderr to
 * /dev/null, or to $SPAWN_N_LOGS/<index>.log when that folder is set), waits for all, and
 * prints the seconds from the first start to the last exit, then the number of copies that
 * failed. In ARGS, "{i}" becomes the copy's index. A fast
 * spawner, so that starting 1024 agents is not what the rendezvous benchmark measures. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

extern char** environ;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: spawn_n N CMD ARGS...\n");
    return 2;
  }
  int n = atoi(argv[1]);
  char** args = argv + 2;
  int nargs = argc - 2;
  const char* logs = getenv("SPAWN_N_LOGS");
  double t0 = now();
  int started = 0;
  for (int i = 0; i < n; ++i) {
    char* a[nargs + 1];
    char idx[16];
    snprintf(idx, sizeof idx, "%d", i);
    for (int j = 0; j < nargs; ++j) {
      char* p = strstr(args[j], "{i}");
      if (!p) {
        a[j] = args[j];
        continue;
      }
      size_t len = strlen(args[j]) + strlen(idx);
      a[j] = malloc(len + 1);
      snprintf(a[j], len + 1, "%.*s%s%s", (int)(p - args[j]), args[j], idx, p + 3);
    }
    a[nargs] = NULL;
    char out[4096] = "/dev/null";
    if (logs && *logs) snprintf(out, sizeof out, "%s/%d.log", logs, i);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    if (posix_spawnp(&pid, a[0], &fa, NULL, a, environ) == 0) ++started;
    posix_spawn_file_actions_destroy(&fa);
  }
  int failed = n - started, status;
  while (wait(&status) > 0)
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  printf("%.6f %d\n", now() - t0, failed);
  return 0;
}
