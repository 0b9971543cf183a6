"""Issue 3: what the console shows: idle-flushed progress bars, lines over 1 MiB split with
continuation marks (shorter ones whole), UTF-8 written byte by byte, --tee/--redirects with --log-dir,
--local-ranks-filter, prefix templates, --log-timestamps."""
import glob
import json
import os
import select
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DdprunTestCase, clean_env, read_text, scaled, worker

CONT = b"\\\n"  # StreamForwarder::kContinuation
MAX_LINE = 1024 * 1024  # StreamForwarder::kMaxLine


def lines_of(tag, ranks, kind="out", n=3):
    return [f"{kind} {tag} r{r} {i}" for r in ranks for i in range(n)]


class ProgressAndLinesTest(DdprunTestCase):
    def test_progress_bar_flushed_while_worker_runs(self):
        p = self.start(["--standalone", worker("progress.py"), self.tmp], stdout=subprocess.PIPE)
        fd = p.stdout.fileno()
        got = b""
        deadline = time.monotonic() + scaled(30)  # a hang guard
        bar_done_at = None
        seen_at = None
        while time.monotonic() < deadline and seen_at is None:
            r, _, _ = select.select([fd], [], [], 0.05)
            if r:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                got += chunk
            if bar_done_at is None and os.path.exists(self.path("bar_done")):
                bar_done_at = time.monotonic()
            if b"progress 100%" in got:
                seen_at = time.monotonic()
        # The worker runs until the test releases it: the bar can only have come by an idle flush.
        self.assertIsNotNone(seen_at, f"the progress bar never reached the console before EOF: {got!r}")
        self.assertIsNone(p.poll(), "seen only after ddprun exited: no idle flush")
        self.assertTrue(os.path.exists(self.path("bar_done")))
        if bar_done_at is not None:
            # The idle flush comes 100 ms after the last byte: the bound is far from that.
            self.assertLess(seen_at - bar_done_at, scaled(5), "idle flush took too long")
        self.assertIn(b"[rank0]:progress 10%\r", got)
        self.assertIn(b"[rank0]:progress 50%\r", got)
        open(self.path("release"), "w").close()
        rest = p.stdout.read()
        p.wait(timeout=scaled(30))
        self.assertEqual(p.returncode, 0)
        out = got + rest
        self.assertEqual(out.count(b"progress 100%"), 1, out)

    def test_unfinished_last_line_is_ended_after_idle_flush(self):
        # A bar flushed while idle, then the worker exits: the console line must be ended
        # with '\n' (as it would be without the idle flush).
        res = self.run_ddprun(["--standalone", "--no-python", "sh", "-c", "printf 'progress 100%%'; sleep 0.5"])
        self.assertEqual(res.rc, 0, res)
        self.assertEqual(res.out, b"[rank0]:progress 100%\n")

    def test_a_failure_after_a_progress_bar_reports_what_the_terminal_showed(self):
        """A tqdm-style bar (each state begins with '\\r') on stderr, then a last word without
        a newline and a failure: the summary's tail holds the bar's last state and that last
        word (it held every state of the bar, and said "no output" for an unfinished last
        line that an idle flush had sent), and the console has no empty piece for a bar's
        leading '\\r'."""
        bar = ("import sys, time\n"
               "for i in range(0, 101, 10):\n"
               "    sys.stderr.write(f'\\rtrain {i}%|'); sys.stderr.flush(); time.sleep(0.01)\n"
               "sys.stderr.write('\\n'); sys.stderr.write('fatal: disk full'); sys.stderr.flush()\n"
               "time.sleep(0.5); sys.exit(3)\n")
        script = self.path("bar.py")
        with open(script, "w") as f:
            f.write(bar)
        res = self.run_ddprun(["--standalone", script])
        self.assertEqual(res.rc, 3, res)
        self.assertIn("traceback : last 2 lines of stderr:\n" + " " * 16 + "train 100%|\n" + " " * 16 +
                      "fatal: disk full\n", res.stderr)
        self.assertNotIn("[rank0]:\r", res.stderr)
        self.assertIn("[rank0]:train 0%|\r[rank0]:train 10%|\r", res.stderr)

    def test_raw_output_keeps_an_unfinished_last_line_as_it_is(self):
        res = self.run_ddprun(["--standalone", "--log-line-prefix-template", "", "--no-python", "sh", "-c",
                               "printf 'a\\rb'"])
        self.assertEqual(res.rc, 0, res)
        self.assertEqual(res.out, b"a\rb")

    def test_unfinished_last_line_ended_without_idle_flush(self):
        res = self.run_ddprun(["--standalone", "--no-python", "sh", "-c", "printf 'no newline'"])
        self.assertEqual(res.rc, 0, res)
        self.assertEqual(res.out, b"[rank0]:no newline\n")

    def test_megabyte_line_split_and_reassembled(self):
        res = self.run_ddprun(["--standalone", worker("bigline.py"), self.tmp])
        self.assertEqual(res.rc, 0, res)
        with open(self.path("line.bin"), "rb") as f:
            original = f.read()
        prefix = b"[rank0]:"
        pieces = res.out.split(b"\n")
        self.assertEqual(pieces[-1], b"", "stdout must end with a newline")
        pieces = [p + b"\n" for p in pieces[:-1]]
        self.assertEqual(pieces[-1], prefix + b"after\n")
        body = b""
        torn = []
        n_pieces = 0
        for i, piece in enumerate(pieces[:-1]):
            n_pieces += 1
            self.assertTrue(piece.startswith(prefix), f"piece {i} lacks the prefix")
            b = piece[len(prefix):]
            last = i == len(pieces) - 2
            if not last:
                self.assertTrue(b.endswith(CONT), f"piece {i} lacks the continuation mark")
                b = b[:-len(CONT)]
                self.assertLessEqual(len(b), MAX_LINE)
            else:
                self.assertFalse(b.endswith(CONT), "the last piece ends the line")
                b = b[:-1]
            try:
                b.decode("utf-8")
            except UnicodeDecodeError:
                torn.append(i)
            body += b
        self.assertGreaterEqual(n_pieces, len(original) // MAX_LINE)
        self.assertEqual(len(body), len(original))
        self.assertTrue(body == original, "the pieces do not reassemble to the line")
        self.assertEqual(torn, [], f"{len(torn)} of {n_pieces} pieces split a UTF-8 character")

    def test_a_long_json_line_arrives_whole(self):
        """A 200 kB line (a JSON record, base64) is one prefixed line on the console, as it is
        one line under torchrun (before, ddprun cut lines into 64 KiB pieces)."""
        res = self.run_ddprun(["--standalone", "--nproc-per-node", "2", "--no-python", sys.executable, "-c",
                               "import json; print(json.dumps({'data': 'B' * 200000}))"])
        self.assertEqual(res.rc, 0, res)
        lines = res.out.decode().splitlines()
        self.assertEqual(sorted(len(l) for l in lines), [len("[rankN]:") + 200012] * 2, [l[:40] for l in lines])
        for l in lines:
            self.assertEqual(len(json.loads(l.split(":", 1)[1])["data"]), 200000)

    def test_megabyte_line_kept_byte_for_byte_in_raw_output(self):
        """An empty prefix (raw output, as torchrun's console): the 3 MiB line arrives as
        written, with no continuation marks or newlines in it (a JSON line piped into a
        parser); the log file of --tee has it too."""
        res = self.run_ddprun(["--standalone", "--log-line-prefix-template", "", "--log-dir", self.path("logs"),
                               "--tee", "1", worker("bigline.py"), self.tmp])
        self.assertEqual(res.rc, 0, res)
        with open(self.path("line.bin"), "rb") as f:
            original = f.read()
        self.assertTrue(res.out == original + b"\nafter\n", "the line was changed on the way")

    def test_utf8_written_byte_by_byte_arrives_whole(self):
        res = self.run_ddprun(["--standalone", worker("utf8_slow.py")])
        self.assertEqual(res.rc, 0, res)
        self.assertEqual(res.out, "[rank0]:xé€😀\n".encode())
        res.out.decode("utf-8")


class LogFilesTest(DdprunTestCase):
    def attempt_dir(self, log_dir, run_id, attempt=0):
        dirs = glob.glob(os.path.join(log_dir, f"{run_id}_*"))
        self.assertEqual(len(dirs), 1, f"expected one <log_dir>/{run_id}_<suffix>: {os.listdir(log_dir)}")
        d = os.path.join(dirs[0], f"attempt_{attempt}")
        self.assertTrue(os.path.isdir(d), d)
        return d

    def test_tee_both_streams(self):
        log_dir = self.path("logs")
        res = self.run_ddprun(["--nproc-per-node", "2", "--rdzv-id", "myjob", "--log-dir", log_dir, "--tee", "3",
                               worker("lines.py"), "t"])
        self.assertEqual(res.rc, 0, res)
        d = self.attempt_dir(log_dir, "myjob")
        for r in range(2):
            self.assertEqual(read_text(os.path.join(d, str(r), "stdout.log")).splitlines(), lines_of("t", [r]))
            self.assertEqual(read_text(os.path.join(d, str(r), "stderr.log")).splitlines(),
                             lines_of("t", [r], "err"))
            for i in range(3):
                self.assertIn(f"[rank{r}]:out t r{r} {i}\n", res.stdout)
                self.assertIn(f"[rank{r}]:err t r{r} {i}\n", res.stderr)

    def test_redirects_map(self):
        log_dir = self.path("logs")
        res = self.run_ddprun(["--nproc-per-node", "2", "--log-dir", log_dir, "-r", "0:1,1:2",
                               worker("lines.py"), "m"])
        self.assertEqual(res.rc, 0, res)
        d = self.attempt_dir(log_dir, "none")
        # rank 0: stdout to its file only; stderr on the console.
        self.assertEqual(read_text(os.path.join(d, "0", "stdout.log")).splitlines(), lines_of("m", [0]))
        self.assertNotIn("out m r0", res.stdout)
        self.assertIn("[rank0]:err m r0 0\n", res.stderr)
        # rank 1: stderr to its file only; stdout on the console.
        self.assertEqual(read_text(os.path.join(d, "1", "stderr.log")).splitlines(), lines_of("m", [1], "err"))
        self.assertNotIn("err m r1", res.stderr)
        self.assertIn("[rank1]:out m r1 2\n", res.stdout)

    def test_redirect_both_leaves_console_empty(self):
        log_dir = self.path("logs")
        res = self.run_ddprun(["--nproc-per-node", "2", "--log-dir", log_dir, "--redirects", "3",
                               worker("lines.py"), "q"])
        self.assertEqual(res.rc, 0, res)
        self.assertNotIn("out q", res.stdout)
        self.assertNotIn("err q", res.stderr)
        d = self.attempt_dir(log_dir, "none")
        self.assertEqual(read_text(os.path.join(d, "1", "stdout.log")).splitlines(), lines_of("q", [1]))

    def test_a_log_truncated_in_place_goes_on_from_its_new_end(self):
        # logrotate's copytruncate: the log is copied, then truncated to 0 while the job writes
        # on. Opened without O_APPEND, the next write went to the old offset, behind NULs.
        script = self.path("rotated.py")
        with open(script, "w") as f:
            f.write("import os, sys, time\n"
                    "print('before ' + 'x' * 4000, flush=True)\n"
                    "while not os.path.exists(sys.argv[1]):\n"
                    "    time.sleep(0.02)\n"
                    "print('after', flush=True)\n")
        for flags in (["--redirects", "1"], ["--tee", "1"]):
            with self.subTest(flags=flags):
                log_dir, go = self.path(f"logs{flags[0]}"), self.path(f"go{flags[0]}")
                p = self.start(["--nproc-per-node", "1", "--log-dir", log_dir, *flags, script, go])
                log = lambda: glob.glob(os.path.join(log_dir, "*", "attempt_0", "0", "stdout.log"))
                # (The whole line, its newline too: truncated before that, the newline led the file.)
                self.wait_for(lambda: log() and read_text(log()[0]).endswith("x\n"), what="the first line in the log")
                os.truncate(log()[0], 0)
                open(go, "w").close()
                self.assertEqual(p.wait(timeout=scaled(60)), 0, read_text(self.path("ddprun.stderr")))
                self.assertEqual(read_text(log()[0]), "after\n")

    def test_attempt_dirs_per_restart(self):
        log_dir = self.path("logs")
        res = self.run_ddprun(["--nproc-per-node", "1", "--log-dir", log_dir, "--tee", "2", "--max-restarts", "1",
                               worker("restart.py"), self.tmp, "1", "3"])
        self.assertEqual(res.rc, 0, res)
        self.assertIn("rank 0 failing attempt 0", read_text(os.path.join(self.attempt_dir(log_dir, "none", 0),
                                                                          "0", "stderr.log")))
        self.assertEqual(read_text(os.path.join(self.attempt_dir(log_dir, "none", 1), "0", "stderr.log")), "")

    def filtered(self, log_dir, stream):
        return read_text(os.path.join(self.attempt_dir(log_dir, "none"), f"filtered_{stream}.log")).splitlines()

    def test_duplicate_filters_copy_the_teed_lines_that_match(self):
        log_dir = self.path("logs")
        res = self.run_ddprun(["--nproc-per-node", "2", "--log-dir", log_dir, "--tee", "3",
                               "--duplicate-stdout-filters", "loss,a,,b", "--duplicate-stderr-filters", "warn",
                               worker("filtered.py")])
        self.assertEqual(res.rc, 0, res)
        want = [f"[rank{r}]:{line}" for r in range(2) for line in ("step 1 loss 0.5", "a,b here", "loss late")]
        self.assertEqual(sorted(self.filtered(log_dir, "stdout")), sorted(want))
        self.assertEqual(sorted(self.filtered(log_dir, "stderr")), ["[rank0]:warn x", "[rank1]:warn x"])
        self.assertIn("[rank1]:other\n", res.stdout)  # the console is untouched

    def test_duplicate_filters_take_only_teed_and_shown_ranks(self):
        log_dir = self.path("logs")
        env = clean_env(PET_DUPLICATE_STDOUT_FILTERS="loss")
        res = self.run_ddprun(["--nproc-per-node", "3", "--log-dir", log_dir, "--tee", "0:1,1:1",
                               "--local-ranks-filter", "1,2", worker("filtered.py")], env=env)
        self.assertEqual(res.rc, 0, res)
        self.assertEqual(self.filtered(log_dir, "stdout"), ["[rank1]:step 1 loss 0.5", "[rank1]:loss late"])
        self.assertNotIn("no line is copied", res.stderr)

    def test_duplicate_filters_without_tee_say_nothing_is_copied(self):
        log_dir = self.path("logs")
        res = self.run_ddprun(["--log-dir", log_dir, "--duplicate-stderr-filters", "warn", worker("filtered.py")])
        self.assertEqual(res.rc, 0, res)
        self.assertIn("--duplicate-stderr-filters: no local rank's stderr is given to --tee, so no line is copied",
                      res.stderr)
        self.assertIn("[rank0]:warn x", res.stderr)


class ConsoleFormatTest(DdprunTestCase):
    def test_local_ranks_filter(self):
        res = self.run_ddprun(["--nproc-per-node", "4", "--local-ranks-filter", "0,2", worker("lines.py"), "f"])
        self.assertEqual(res.rc, 0, res)
        out = [l for l in res.stdout.splitlines()]
        err = [l for l in res.stderr.splitlines() if not l.startswith("[ddprun")]
        self.assertEqual(sorted(out), sorted(f"[rank{r}]:{l}" for r in (0, 2) for l in lines_of("f", [r])))
        self.assertEqual(sorted(err), sorted(f"[rank{r}]:{l}" for r in (0, 2) for l in lines_of("f", [r], "err")))

    def test_local_ranks_filter_of_ranks_this_node_lacks(self):
        # torchrun shows nothing and says nothing; the job itself runs as before.
        res = self.run_ddprun(["--nproc-per-node", "2", "--local-ranks-filter", "7", worker("lines.py"), "g"])
        self.assertEqual(res.rc, 0, res)
        self.assertEqual(res.stdout, "")
        self.assertIn("warning] --local-ranks-filter: this node has 2 workers (local ranks 0..1), no local rank 7: "
                      "no worker's output reaches the console\n", res.stderr)
        self.assertEqual([l for l in res.stderr.splitlines() if not l.startswith("[ddprun")], [])

    def test_prefix_template_flag(self):
        host = socket.gethostname()
        res = self.run_ddprun(["--nproc-per-node", "2", "--role", "trainer", "--log-line-prefix-template",
                               "[${role_name}${local_rank}@${hostname}]", worker("lines.py"), "p"])
        self.assertEqual(res.rc, 0, res)
        for r in range(2):
            self.assertIn(f"[trainer{r}@{host}]out p r{r} 0\n", res.stdout)
            self.assertIn(f"[trainer{r}@{host}]err p r{r} 1\n", res.stderr)
        self.assertNotIn("[rank0]", res.stdout)

    def test_prefix_template_environment(self):
        env = clean_env(TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="<${rank}|${local_rank}> ")
        res = self.run_ddprun(["--nproc-per-node", "2", worker("lines.py"), "e"], env=env)
        self.assertEqual(res.rc, 0, res)
        self.assertIn("<1|1> out e r1 0\n", res.stdout)
        # The command line beats the environment.
        res = self.run_ddprun(["--nproc-per-node", "2", "--log-line-prefix-template", "#${rank}#",
                               worker("lines.py"), "e"], env=env)
        self.assertIn("#1#out e r1 0\n", res.stdout)
        self.assertNotIn("<1|1>", res.stdout)

    def test_empty_template_forwards_raw(self):
        res = self.run_ddprun(["--nproc-per-node", "2", "--log-line-prefix-template", "", worker("lines.py"), "r"])
        self.assertEqual(res.rc, 0, res)
        self.assertEqual(sorted(res.stdout.splitlines()), sorted(lines_of("r", [0, 1])))

    def test_own_messages_start_on_their_own_line(self):
        # rank 0 leaves an unfinished line on stderr (flushed while idle); then rank 1 fails and
        # ddprun logs about it: its message must not be glued onto rank 0's line.
        script = 'if [ "$RANK" = 0 ]; then printf "loading..." >&2; sleep 30; else sleep 0.6; exit 3; fi'
        res = self.run_ddprun(["--nproc-per-node", "2", "--no-python", "sh", "-c", script])
        self.assertEqual(res.rc, 3, res)
        self.assertIn("[rank0]:loading...", res.stderr)
        for line in res.stderr.splitlines():
            if "[ddprun" in line:
                self.assertTrue(line.startswith("[ddprun"), f"ddprun's message glued onto a worker's line: {line!r}")
        summary_start = res.stderr.index("=" * 60)
        self.assertEqual(res.stderr[summary_start - 1], "\n", "the failure summary must start on its own line")

    def test_log_timestamps(self):
        res = self.run_ddprun(["--standalone", "--log-timestamps", worker("lines.py"), "ts", "2"])
        self.assertEqual(res.rc, 0, res)
        lines = res.stdout.splitlines()
        self.assertEqual(len(lines), 2, res)
        stamp = r"\d{4}-\d\d-\d\d[ T_]\d\d:\d\d:\d\d(\.\d+)?"
        for i, line in enumerate(lines):
            self.assertRegex(line, rf"^({stamp} ?\[rank0\]:|\[rank0\]:{stamp} ?)out ts r0 {i}$")


# Alternate lines to stdout and stderr, as a script's prints and its logging (or a traceback) do.
ALTERNATING = """
import sys
for i in range(int(sys.argv[1])):
    (sys.stdout if i % 2 == 0 else sys.stderr).write("line %d\\n" % i)
if len(sys.argv) > 2:
    raise SystemExit(sys.argv[2])
"""


class OneConsoleTest(DdprunTestCase):
    """ddprun's stdout and stderr on one file (`2>&1`, a terminal): a worker's lines arrive in
    the order it wrote them, whichever stream each went to, as under torchrun, whose workers
    write to that file themselves."""

    def run_on_one_console(self, args, console=None):
        """ddprun with stdout and stderr both on `console` (a file here when None): (exit
        status, what the console got)."""
        own = console is None
        if own:
            console = open(self.path("console"), "w+b")
            self._files.append(console)
        p = self.start(args, stdout=console, stderr=console)
        return self.wait_exit(p, 60), read_text(self.path("console")) if own else None

    def ranks_lines(self, text):
        got = {}
        for line in text.splitlines():
            if line.startswith("[rank") and ":line " in line:
                rank, n = line[len("[rank"):].split("]:line ")
                got.setdefault(int(rank), []).append(int(n))
        return got

    def test_a_file_gets_each_workers_lines_in_order(self):
        script = self.write_script(ALTERNATING)
        rc, text = self.run_on_one_console(["--nproc-per-node", "2", script, "4000"])
        self.assertEqual(rc, 0, text[-2000:])
        self.assertEqual(self.ranks_lines(text), {0: list(range(4000)), 1: list(range(4000))})

    def test_a_terminal_gets_each_workers_lines_in_order(self):
        import pty
        leader, follower = pty.openpty()
        got = bytearray()
        with os.fdopen(follower, "wb", closefd=True) as tty:
            p = self.start(["--nproc-per-node", "2", self.write_script(ALTERNATING), "4000"], stdout=tty, stderr=tty)
        deadline = time.monotonic() + scaled(60)
        while time.monotonic() < deadline:
            if select.select([leader], [], [], 0.1)[0]:
                try:
                    chunk = os.read(leader, 1 << 16)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not chunk:
                    break
                got += chunk
            elif p.poll() is not None:
                break
        os.close(leader)
        self.assertEqual(self.wait_exit(p, 10), 0)
        text = got.decode(errors="replace").replace("\r\n", "\n")
        self.assertEqual(self.ranks_lines(text), {0: list(range(4000)), 1: list(range(4000))})

    def test_the_failure_summary_shows_the_last_lines_of_both(self):
        rc, text = self.run_on_one_console(["--nproc-per-node", "1", self.write_script(ALTERNATING), "6", "bad input"])
        self.assertEqual(rc, 1, text)
        def shown(lines):
            return "".join("\n" + " " * 16 + line for line in lines)
        summary = text[text.index("=" * 60):]
        self.assertIn("traceback : last 7 lines of output:" + shown([f"line {i}" for i in range(6)] + ["bad input"]),
                      summary)
        # On two files, stderr's own.
        res = self.run_ddprun(["--nproc-per-node", "1", self.write_script(ALTERNATING), "6", "bad input"])
        self.assertEqual(res.rc, 1, res)
        self.assertIn("traceback : last 4 lines of stderr:" + shown(["line 1", "line 3", "line 5", "bad input"]),
                      res.stderr)

    def test_log_files_still_get_one_stream_each(self):
        log_dir = self.path("logs")
        rc, text = self.run_on_one_console(["--nproc-per-node", "1", "--log-dir", log_dir, "--tee", "3",
                                            self.write_script(ALTERNATING), "10"])
        self.assertEqual(rc, 0, text)
        out, = glob.glob(os.path.join(log_dir, "*", "attempt_0", "0", "stdout.log"))
        err, = glob.glob(os.path.join(log_dir, "*", "attempt_0", "0", "stderr.log"))
        self.assertEqual(read_text(out), "".join(f"line {i}\n" for i in range(0, 10, 2)))
        self.assertEqual(read_text(err), "".join(f"line {i}\n" for i in range(1, 10, 2)))
        self.assertEqual(sorted(self.ranks_lines(text)[0]), list(range(10)))

    def write_script(self, text):
        path = self.path("alternating.py")
        with open(path, "w") as f:
            f.write(text)
        return path


if __name__ == "__main__":
    unittest.main(verbosity=2)
