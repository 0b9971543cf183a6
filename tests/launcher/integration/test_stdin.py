"""Workers and the terminal: a piped stdin reaches the workers; a terminal reaches them when
ddprun is its foreground job (workers lead sessions of their own, so a terminal never stops
them), and /dev/null replaces it when ddprun runs in the background. On a terminal, each
worker writes into a pseudo-terminal of its own."""
import fcntl
import os
import select
import socket
import struct
import subprocess
import sys
import termios
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DDPRUN, PYTHON, DdprunTestCase, clean_env, free_port, process_state, scaled

READER = "read line; echo \"rc=$? line=$line\""


class StdinTest(DdprunTestCase):
    def test_piped_stdin_reaches_the_worker(self):
        env = clean_env(TMPDIR=self.tmp)
        p = subprocess.run([DDPRUN, "--no-python", "sh", "-c", READER], input=b"hello\n",
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=self.tmp,
                           timeout=scaled(60))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(b"[rank0]:rc=0 line=hello", p.stdout)

    def test_a_closed_stdin_is_dev_null_for_cold_and_warm_workers(self):
        # `ddprun ... <&-`: fd 0 is then one of ddprun's own (its signalfd reached warm workers).
        script = self.script("import os\nprint('stdin', os.readlink('/proc/self/fd/0'))\n")
        for extra in ([], ["--preload", "json"]):
            with self.subTest(flags=extra):
                p = subprocess.run([DDPRUN, *extra, script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   env=clean_env(TMPDIR=self.tmp), cwd=self.tmp, timeout=scaled(60),
                                   preexec_fn=lambda: os.close(0))
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertIn(b"[rank0]:stdin /dev/null", p.stdout)

    def test_a_foreground_job_passes_its_terminal_on(self):
        # input() and pdb read the terminal as under torchrun; a warm worker (--preload) too.
        for extra in ([], ["--preload", "json"]):
            with self.subTest(flags=extra):
                t = Terminal(self, [DDPRUN, "--nproc-per-node", "1", *extra, self.script(ASK)])
                t.expect("[rank0]:isatty True")
                t.expect("name? ")  # a prompt, shown unfinished once its worker is idle
                t.send(b"alice\n")
                # The prompt's line goes on (the worker's own stream has no newline in between).
                t.expect("[rank0]:name? alice\r\ngot alice\r\n")
                self.assertEqual(t.finish(), 0, t.text())

    def test_breakpoint_in_a_worker_is_a_pdb_session_on_the_terminal(self):
        t = Terminal(self, [DDPRUN, "--nproc-per-node", "1", self.script(BREAKPOINT)])
        t.expect("[rank0]:-> print(\"x is\", x + 1)")
        t.expect("(Pdb) ")
        t.send(b"p x\n")
        t.expect("[rank0]:(Pdb) p x\r\n[rank0]:41\r\n")
        # Line editing: the worker's stdout is a terminal (of its own), so pdb has readline:
        # the up arrow brings `p x` back, a backspace edits it.
        t.expect("[rank0]:41\r\n[rank0]:(Pdb) ")
        mark = len(t.out)
        t.send(b"\x1b[A")
        t.expect("p x", since=mark)
        t.send(b"\x7fx + 1\n")
        t.expect("[rank0]:42\r\n", since=mark)
        t.send(b"c\n")
        t.expect("x is 42")
        self.assertEqual(t.finish(), 0, t.text())

    def test_getpass_in_a_worker_turns_echo_off_instead_of_stopping(self):
        # getpass sets the terminal's modes: from a background group of ddprun's session that
        # is SIGTTOU, which stopped the worker and hung the job.
        t = Terminal(self, [DDPRUN, "--nproc-per-node", "1", self.script(PASSWORD)])
        t.expect("pw? ")
        t.send(b"secret\n")
        t.expect("[rank0]:pw secret")
        self.assertEqual(t.finish(), 0, t.text())
        self.assertEqual(t.text().count("secret"), 1, f"the password was echoed: {t.text()!r}")

    def test_ctrl_c_while_a_worker_reads_the_terminal_stops_the_job(self):
        t = Terminal(self, [DDPRUN, "--nproc-per-node", "1", self.script(ASK)])
        t.expect("name? ")
        t0 = time.monotonic()
        t.send(b"\x03")  # the terminal's SIGINT reaches ddprun's group alone; ddprun passes it on
        rc = t.finish()
        self.assertLess(time.monotonic() - t0, scaled(10))
        self.assertEqual(rc, 130, t.text())
        self.assertIn("KeyboardInterrupt", t.text())

    def test_ctrl_z_stops_the_whole_job_until_fg(self):
        # As a shell's job: ddprun and its workers stop (the terminal's SIGTSTP reaches ddprun
        # alone) and go on together; the time stopped, longer than --hang-timeout, is no hang.
        hang = scaled(3)
        t, job = self.shell_job("--hang-timeout", str(hang), self.script(TICKER))
        t.expect("[rank0]:tick 3 ")
        worker = int(t.text().split("tick 3 ")[1].split()[0])
        self.track_pid(worker)
        self.hold_stopped(t, hang + 1.5, "tick", (job, worker))
        t.send(b"fg\n")
        self.assertEqual(t.finish(), 0, t.text())
        self.assertIn("[rank0]:tick 39 ", t.text())
        self.assertNotIn("hang", t.text())

    def test_time_stopped_leaves_the_shutdown_timeout_whole(self):
        # Ctrl-C, Ctrl-Z while the worker saves (2 s of its --shutdown-timeout), fg after longer
        # than the timeout: the save goes on to its end (SIGKILL came at once).
        grace = scaled(5)
        t, job = self.shell_job("--shutdown-timeout", str(grace), self.script(SAVER))
        t.expect("[rank0]:ready")
        t.send(b"\x03")
        t.expect("[rank0]:saving")
        t.send(b"\x1a")
        t.expect("[stopped]")
        time.sleep(grace + 1)
        t.send(b"fg\n")
        self.assertEqual(t.finish(), 130, t.text())
        self.assertIn("[rank0]:saved", t.text())
        self.assertNotIn("SIGKILL", t.text().split("[stopped]")[1])

    def test_ctrl_z_while_preload_imports_spends_no_hang_timeout(self):
        # The warm process stops too, and its import's limit (--hang-timeout) moves on by the
        # time stopped, longer than it: the workers still start warm.
        with open(os.path.join(self.tmp, "slowmod.py"), "w") as f:
            f.write('import time\nfor i in range(15):\n    print("importing", i, flush=True)\n    time.sleep(0.1)\n')
        hang = scaled(5)
        t, job = self.shell_job("--preload", "slowmod", "--hang-timeout", str(hang),
                                self.script("import sys\nprint('warm', 'slowmod' in sys.modules)\n"))
        t.expect("importing 0")
        self.hold_stopped(t, hang + 1, "importing")
        t.send(b"fg\n")
        self.assertEqual(t.finish(), 0, t.text())
        self.assertIn("[rank0]:warm True", t.text())
        self.assertNotIn("did not import", t.text())

    def test_bg_warns_that_the_workers_still_read_the_terminal(self):
        # (ddprun run by a script: the job-control shell is its parent's parent)
        t, job = self.shell_job(self.script(TICKER), via_sh=True)
        t.expect("[rank0]:tick 1 ")
        worker = int(t.text().split("tick 1 ")[1].split()[0])
        self.track_pid(worker)
        # (the shell stops at once; ddprun only once it read its SIGTSTP, which a SIGCONT sent
        # before that would discard: bg waits for the worker stopped by ddprun)
        self.hold_stopped(t, 0.2, "tick", (worker,))
        t.send(b"bg\n")
        t.expect("continued in the background: the workers still read this terminal")
        self.assertEqual(t.finish(), 0, t.text())

    def test_ctrl_z_does_not_stop_one_node_of_several(self):
        # Its lease would lapse and the other node go on without it: a warning instead.
        port = free_port()
        script = self.script(TICKER)
        other = self.start(["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
                            str(port), "--nproc-per-node", "1", script])
        t, job = self.shell_job("--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1",
                                "--master-port", str(port), script)
        t.expect("[rank0]:tick 3 ")
        t.send(b"\x1a")
        t.expect("received SIGTSTP: not stopping one node of 2")
        self.assertNotIn(process_state(job), ("T", ""), "ddprun stopped")
        self.assertEqual(t.finish(), 0, t.text())
        self.assertEqual(other.wait(timeout=scaled(30)), 0)

    def test_sigtstp_in_signals_to_handle_stops_the_job_as_torchrun(self):
        t, job = self.shell_job("--signals-to-handle", "SIGTERM,SIGINT,SIGTSTP", self.script(TICKER))
        t.expect("[rank0]:tick 3 ")
        t.send(b"\x1a")
        self.assertEqual(t.finish(), 128 + 20, t.text())  # (SIGTSTP is 20)
        self.assertIn("received SIGTSTP: forwarding it to the workers", t.text())

    def test_ctrl_z_with_no_job_control_above_is_ignored(self):
        # ddprun leads the terminal's session (tmux, ssh -t, docker exec -it running it
        # directly): nothing could continue a stopped job, so the job runs on, as torchrun's does.
        t = Terminal(self, [DDPRUN, "--nproc-per-node", "1", "--log-level", "info", self.script(TICKER)])
        t.expect("[rank0]:tick 3 ")
        t.send(b"\x1a")
        t.expect("received SIGTSTP: nothing above ddprun could continue the job")
        time.sleep(0.3)
        self.assertNotIn(process_state(t.p.pid), ("T", ""), "ddprun stopped")
        self.assertEqual(t.finish(), 0, t.text())
        self.assertIn("[rank0]:tick 39 ", t.text())

    def hold_stopped(self, t, seconds, word, pids=()):
        """Ctrl-Z, then `seconds` with the job stopped (pids too): no more of `word` shown."""
        t.send(b"\x1a")
        t.expect("[stopped]")
        for pid in pids:
            self.wait_for(lambda: process_state(pid) == "T", 10, f"pid {pid} stopped")
        t.read(0.3)
        shown = t.text().count(word)
        time.sleep(seconds)
        t.read(0.3)
        self.assertEqual(t.text().count(word), shown, f"{word!r} went on while the job was stopped")

    def shell_job(self, *args, via_sh=False):
        """ddprun ARGS as a job of JOB_SHELL on a new terminal, or run by a `sh -c` script that
        is the job: (the terminal, the job's pid)."""
        argv = [DDPRUN, "--nproc-per-node", "1", *args]
        if via_sh:
            argv = ["sh", "-c", '"$@"; exit $?', "sh", *argv]
        t = Terminal(self, [PYTHON, "-c", JOB_SHELL, *argv])
        t.expect("[job ")
        job = int(t.text().split("[job ")[1].split("]")[0])
        self.track_pid(job)
        return t, job

    def test_a_background_job_gives_its_workers_dev_null(self):
        # `ddprun ... &` on a terminal: reading it would take the shell's input, so the workers
        # get EOF at once (and are never stopped by SIGTTIN, which would hang the job).
        t0 = time.monotonic()
        t = Terminal(self, [PYTHON, "-c", IN_BACKGROUND, DDPRUN, "--nproc-per-node", "2", "--no-python",
                            "sh", "-c", READER])
        self.assertEqual(t.finish(), 0, t.text())
        self.assertLess(time.monotonic() - t0, scaled(20))
        for r in (0, 1):
            self.assertIn(f"[rank{r}]:rc=1 line=", t.text())

    def script(self, text, name="worker.py"):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path


class WorkerTerminalTest(DdprunTestCase):
    """On a terminal, each worker writes into a pseudo-terminal of its own, as wide as the
    terminal less the prefix: isatty() is true and C stdio flushes each line, as where
    torchrun's workers write to the terminal themselves. Elsewhere, pipes."""
    script = StdinTest.script

    def test_a_worker_on_a_terminal_writes_into_a_terminal_its_own_width(self):
        for extra, cols in (([], 100 - len("[rank0]:")), (["--log-line-prefix-template", "[${hostname}]"], None)):
            with self.subTest(flags=extra):
                t = Terminal(self, [DDPRUN, *extra, self.script(SIZES)], size=(30, 100))
                t.expect("tty True True")
                self.assertEqual(t.finish(), 0, t.text())
                want = cols or 100 - len(f"[{socket.gethostname()}]")
                self.assertIn(f"tty True True {want}x30\r\n", t.text())

    def test_a_resized_terminal_resizes_the_workers(self):
        t = Terminal(self, [DDPRUN, "--nproc-per-node", "2", self.script(RESIZED)], size=(30, 100))
        t.expect("[rank0]:from 92x30")
        t.expect("[rank1]:from 92x30")
        t.resize(40, 60)  # the terminal sends ddprun SIGWINCH
        self.assertEqual(t.finish(), 0, t.text())
        # No SIGWINCH (as under torchrun): readline's handler would make C calls fail, EINTR.
        self.assertIn("[rank0]:to 52x40 not told", t.text())
        self.assertIn("[rank1]:to 52x40 not told", t.text())

    def test_a_programs_lines_show_as_it_prints_them(self):
        # A program whose stdio buffers a pipe (Perl here; C and C++ programs, a shell's
        # commands alike) printed nothing until it exited; its "ready" is shown at once now.
        t = Terminal(self, [DDPRUN, "--no-python", "perl", "-e", 'print "ready\\n"; sleep 600'])
        t.expect("[rank0]:ready", timeout=15)
        t.send(b"\x03")
        self.assertEqual(t.finish(), 130, t.text())

    def test_a_worker_stopped_at_a_pdb_prompt_leaves_the_terminal_as_it_was(self):
        # pdb's readline turns the terminal's echo and line editing off while it waits; rank
        # 1's failure kills rank 0 there: the terminal was left so after ddprun exited.
        go = os.path.join(self.tmp, "go")
        t = Terminal(self, [DDPRUN, "--nproc-per-node", "2", self.script(PDB_THEN_PEER_FAILS), go], size=(30, 100))
        before = termios.tcgetattr(t.master)  # (a pty's master reads its terminal's modes)
        t.expect("(Pdb) ")
        time.sleep(0.5)
        self.assertNotEqual(termios.tcgetattr(t.master)[3], before[3], "readline did not change the modes")
        open(go, "w").close()
        self.assertEqual(t.finish(), 1, t.text())
        self.assertEqual(termios.tcgetattr(t.master), before)

    def test_a_pager_in_a_worker_does_not_wait_for_keys(self):
        # pydoc's help() (git log, man alike) starts a pager on a terminal: on the worker's,
        # which has no keyboard, it waited for ever (Ctrl-C, 30 s, SIGKILL). Pagers are cat
        # there, also the one a user's shell exports.
        t = Terminal(self, ["env", "-u", "MANPAGER", "PAGER=less", DDPRUN, "--no-python", PYTHON, "-c",
                            "help(len)"], size=(30, 100))
        t.expect("Return the number of items in a container", timeout=30)
        self.assertEqual(t.finish(timeout=30), 0, t.text())

    def test_pipes_where_the_output_is_no_terminal_or_a_file_or_not_wanted(self):
        script = self.script(SIZES)
        cases = (("a pipe", [], subprocess.PIPE), ("--no-worker-tty", ["--no-worker-tty"], None),
                 ("--tee", ["--tee", "3", "--log-dir", os.path.join(self.tmp, "logs")], None))
        for name, extra, stdout in cases:
            with self.subTest(name):
                argv = [DDPRUN, *extra, script]
                if stdout:
                    p = subprocess.run(argv, stdout=stdout, stderr=subprocess.STDOUT, env=clean_env(TMPDIR=self.tmp),
                                       cwd=self.tmp, timeout=scaled(60))
                    rc, text = p.returncode, p.stdout.decode()
                else:
                    t = Terminal(self, argv, size=(30, 100))
                    rc, text = t.finish(), t.text()
                self.assertEqual(rc, 0, text)
                self.assertIn("[rank0]:tty False False", text)

    def test_a_flood_on_a_terminal_loses_nothing(self):
        # Two workers write 20000 lines each and exit; one worker writes them and fails at
        # once: every line is read from its terminal, and the summary has the traceback.
        for nproc, fail in ((2, []), (1, ["fail"])):
            with self.subTest(nproc=nproc, fail=fail):
                t = Terminal(self, [DDPRUN, "--nproc-per-node", str(nproc), self.script(FLOOD), *fail], size=(30, 100))
                rc = t.finish(timeout=120)
                self.assertEqual(rc, 1 if fail else 0, t.text()[-2000:])
                for r in range(nproc):
                    self.assertEqual(t.text().count(f"[rank{r}]:line "), 20000)
                    self.assertIn(f"[rank{r}]:line 19999 {'x' * 60}\r\n", t.text())
                if fail:
                    self.assertIn("ValueError: after the flood", t.text().split("ddprun: error")[-1])

SIZES = ('import os, sys\ntry:\n    size = "%dx%d" % tuple(os.get_terminal_size())\nexcept OSError:\n    size = "none"\n'
         'print("tty", sys.stdout.isatty(), sys.stderr.isatty(), size)\n')
PDB_THEN_PEER_FAILS = ('import os, sys, time\nif os.environ["RANK"] == "0":\n    breakpoint()\n'
                       'while not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\n'
                       'raise SystemExit("rank 1 fails")\n')
RESIZED = ('import os, signal, time\ntold = []\nsignal.signal(signal.SIGWINCH, lambda *_: told.append(1))\n'
           'first = os.get_terminal_size()\nprint("from %dx%d" % tuple(first))\ndeadline = time.monotonic() + 20\n'
           'while os.get_terminal_size() == first and time.monotonic() < deadline:\n    time.sleep(0.05)\n'
           'time.sleep(0.2)\nprint("to %dx%d" % tuple(os.get_terminal_size()), "told" if told else "not told")\n')
FLOOD = ('import sys\nfor i in range(20000):\n    print("line", i, "x" * 60)\n'
         'if sys.argv[1:]:\n    raise ValueError("after the flood")\n')
ASK = 'import sys\nprint("isatty", sys.stdin.isatty(), flush=True)\nprint("got", input("name? "))\n'
TICKER = ('import os, time\nfor i in range(40):\n    print("tick", i, os.getpid(), flush=True)\n'
          '    time.sleep(0.05)\n')
BREAKPOINT = 'x = 41\nbreakpoint()\nprint("x is", x + 1)\n'
SAVER = ('import signal, sys, time\n'
         'def save(*_):\n'
         '    print("saving", flush=True)\n'
         '    for _ in range(20):\n'
         '        time.sleep(0.1)\n'
         '    print("saved", flush=True)\n'
         '    sys.exit(0)\n'
         'signal.signal(signal.SIGINT, save)\n'
         'print("ready", flush=True)\n'
         'while True:\n'
         '    time.sleep(0.05)\n')
PASSWORD = 'import getpass\nprint("pw", getpass.getpass("pw? "))\n'
# Runs argv in a process group of its own: a background job of the terminal's session.
IN_BACKGROUND = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:], process_group=0))"


# What an interactive shell does for a job: its own process group in the terminal's
# foreground; when it stops, the terminal back and "[stopped]"; then a line: fg or bg.
JOB_SHELL = r"""
import os, signal, subprocess, sys
signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # (tcsetpgrp from a background group)
def foreground():
    os.setpgid(0, 0)
    os.tcsetpgrp(0, os.getpid())
    signal.signal(signal.SIGTTOU, signal.SIG_DFL)
p = subprocess.Popen(sys.argv[1:], preexec_fn=foreground)
print(f"[job {p.pid}]", flush=True)
while True:
    _, status = os.waitpid(p.pid, os.WUNTRACED)
    if not os.WIFSTOPPED(status):
        sys.exit(os.waitstatus_to_exitcode(status))
    os.tcsetpgrp(0, os.getpgrp())
    print("[stopped]", flush=True)
    if sys.stdin.readline().strip() == "fg":
        os.tcsetpgrp(0, p.pid)
    os.killpg(p.pid, signal.SIGCONT)
"""


class Terminal:
    """A new pseudo-terminal, and argv leading a session whose controlling terminal it is, in
    its foreground, as a shell runs a job; what it shows is read as the test goes."""

    def __init__(self, test, argv, size=None):
        master, slave = os.openpty()
        test.addCleanup(os.close, master)
        self.master, self.out = master, b""
        if size:  # (rows, columns)
            self.resize(*size)

        def own_it():  # after the child's setsid and dup2s
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.p = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=test.tmp,
                                  env=clean_env(TMPDIR=test.tmp), start_new_session=True, preexec_fn=own_it)
        test._procs.append(self.p)
        os.close(slave)
        self.master, self.out = master, b""

    def text(self):
        return self.out.decode(errors="replace")

    def resize(self, rows, columns):
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))

    def read(self, timeout):
        """Adds what the terminal shows within timeout to out: False once it has closed."""
        if not select.select([self.master], [], [], max(0.0, timeout))[0]:
            return True
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: no process has the terminal open any more
            return False
        self.out += chunk
        return bool(chunk)

    def expect(self, text, timeout=30, since=0):
        """Waits until text is on the terminal (shown after out[:since], when given)."""
        deadline = time.monotonic() + scaled(timeout)
        while text.encode() not in self.out[since:]:
            if time.monotonic() > deadline or not self.read(deadline - time.monotonic()):
                raise AssertionError(f"{text!r} not on the terminal within {timeout} s: {self.text()!r}")

    def send(self, data):
        os.write(self.master, data)

    def finish(self, timeout=30):
        """The exit status, once the job has ended and its last output is read."""
        deadline = time.monotonic() + scaled(timeout)
        while self.p.poll() is None and time.monotonic() < deadline:
            self.read(0.05)
        rc = self.p.wait(timeout=1)
        while self.read(0.2):
            pass
        return rc


if __name__ == "__main__":
    unittest.main()
