"""Issue 3: the failure summary (stderr tail, signal), ddprun's own TORCHELASTIC_ERROR_FILE,
and --summary-json."""
import os
import signal
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DdprunTestCase, clean_env, free_port, scaled, worker


class SummaryTest(DdprunTestCase):
    def test_shell_worker_segv_summary_has_stderr_tail_and_signal(self):
        res = self.run_ddprun(["--standalone", worker("segv.sh")])
        self.assertEqual(res.rc, 139, res)
        summary = self.summary_block(res.stderr)
        self.assertIn(f"{worker('segv.sh')} FAILED", summary)
        self.assertIn("about to crash in rank 0", summary)
        self.assertIn("loading shard 3", summary)
        self.assertIn("SIGSEGV", summary)
        self.assertIn("exitcode  : -11", summary)
        self.assertIn("<NO_OTHER_FAILURES>", summary)
        # The worker's own stderr lines were forwarded too, before the summary.
        self.assertLess(res.stderr.index("[rank0]:about to crash in rank 0"), res.stderr.index(summary))

    def test_root_cause_error_file_for_ddprun(self):
        err_file = self.path("root_cause.json")
        env = clean_env(TORCHELASTIC_ERROR_FILE=err_file)
        res = self.run_ddprun(["--nproc-per-node", "2", worker("exit_code.sh"), "3"], env=env)
        self.assertEqual(res.rc, 3, res)
        self.assertTrue(os.path.exists(err_file), "ddprun wrote no TORCHELASTIC_ERROR_FILE")
        j = self.load_json(err_file)
        self.assertEqual(j["message"]["errorCode"], 3)
        self.assertIn("message", j["message"])
        self.assertIn("rank 1 giving up", j["message"]["extraInfo"]["py_callstack"])
        # The workers got their own error files, not ddprun's.
        self.assertNotIn(err_file, res.stdout)

    def test_a_stderr_tail_that_is_not_utf8_still_gives_both_json_files(self):
        """A failing worker whose stderr holds a byte that is not UTF-8, and a line past the
        tail's 1024-byte cap that is cut inside a 2-byte character: --summary-json and
        TORCHELASTIC_ERROR_FILE are written (U+FFFD for the bad byte; the cut falls between
        characters) and ddprun exits with the worker's code. Before, the JSON library threw:
        "ddprun: error: [json.exception.type_error.316] ...", exit 1, neither file."""
        path, err_file = self.path("summary.json"), self.path("root_cause.json")
        # "x" and 600 two-byte characters: the cap at 1024 bytes falls inside the 512th.
        script = "printf 'bad byte \\377 here\\n' >&2; printf x >&2; printf '\\303\\251%.0s' $(seq 600) >&2; " \
                 "echo >&2; exit 3"
        res = self.run_ddprun(["--summary-json", path, "--no-python", "sh", "-c", script],
                              env=clean_env(TORCHELASTIC_ERROR_FILE=err_file))
        self.assertEqual(res.rc, 3, res)
        tb = self.load_json(path)["root_cause"]["traceback"]
        self.assertIn("bad byte \ufffd here", tb)
        self.assertIn("x" + "\u00e9" * 511, tb)
        self.assertNotIn("\ufffd", tb.split("here", 1)[1], "the cut split a character")
        self.assertIn("bad byte \ufffd here", self.load_json(err_file)["message"]["extraInfo"]["py_callstack"])

    def test_a_worker_error_file_that_is_no_record_gives_the_workers_code(self):
        """A worker's error file that is JSON but no record (`[1, 2]`): ddprun exits with the
        worker's code and writes its own record. Before: "ddprun: error:
        [json.exception.type_error.305] ...", exit 1."""
        err_file = self.path("root_cause.json")
        res = self.run_ddprun(["--no-python", "sh", "-c", 'echo "[1, 2]" > "$TORCHELASTIC_ERROR_FILE"; exit 3'],
                              env=clean_env(TORCHELASTIC_ERROR_FILE=err_file))
        self.assertEqual(res.rc, 3, res)
        self.assertNotIn("json.exception", res.stderr)
        self.assertIn("ChildFailedError", self.load_json(err_file)["message"]["message"])

    def test_ddprun_s_own_end_is_in_its_error_file(self):
        """As torchrun's @record on its main: when ddprun itself ends the job (no round formed,
        a signal, a hang), TORCHELASTIC_ERROR_FILE says why, as torch's record_exception
        writes it ({"message": {"message": "<kind>: <text>", "extraInfo"}}); a scheduler
        (TorchX) shows it. Before, only a worker's failure was written (QA). A command line
        refused as parsed writes none (torchrun's argparse neither), nor does a failed
        --dump-stacks (run where that variable is a worker's own file)."""
        def ended(args, rc, start=None):
            err_file = self.path(f"launcher_{rc}.json")
            env = clean_env(TORCHELASTIC_ERROR_FILE=err_file)
            if start is None:
                res = self.run_ddprun(args, env=env, timeout=60)
                self.assertEqual(res.rc, rc, res)
            else:
                p = self.start(args, env=env)
                start(p)
                self.assertEqual(p.wait(timeout=scaled(60)), rc)
            j = self.load_json(err_file)["message"]
            self.assertTrue(j["extraInfo"]["timestamp"].isdigit(), j)
            self.assertNotIn("errorCode", j)
            return j
        port = free_port()
        j = ended(["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf",
                   "join_timeout=1", "--no-python", "true"], 1)
        self.assertRegex(j["message"], r"^\w+Error: rendezvous: no round of job '[^']+' formed at the c10d store at "
                                       r"127\.0\.0\.1:\d+ .*within join_timeout 1 s")
        self.assertTrue(j["extraInfo"]["py_callstack"].startswith("ddprun: error: rendezvous: no round"), j)

        def sigterm(p):
            self.wait_for_files([self.path(f"ready_{r}") for r in range(2)])
            os.kill(p.pid, signal.SIGTERM)
        p_args = ["--nproc-per-node", "2", worker("signals.py"), self.tmp, "term"]
        j = ended(p_args, 143, start=sigterm)
        self.assertRegex(j["message"], r"^SignalException: Process \d+ got signal: 15$")

        j = ended(["--hang-timeout", "1", "--no-stack-dumps", "--no-python", "sleep", "30"], 124)
        self.assertRegex(j["message"], r"^TimeoutError: sleep HUNG: no rank made progress for 1 s \(--hang-timeout\)$")
        self.assertIn("=" * 60, j["extraInfo"]["py_callstack"])  # the whole report

        for args, rc in ((["--nnodes", "0", "--no-python", "true"], 2), (["--dump-stacks", "1"], 1)):
            err_file = self.path("none.json")
            res = self.run_ddprun(args, env=clean_env(TORCHELASTIC_ERROR_FILE=err_file))
            self.assertEqual(res.rc, rc, res)
            self.assertFalse(os.path.exists(err_file), args)

    def test_no_error_file_on_success(self):
        err_file = self.path("root_cause.json")
        env = clean_env(TORCHELASTIC_ERROR_FILE=err_file)
        res = self.run_ddprun(["--nproc-per-node", "2", worker("exit_code.sh"), "0"], env=env)
        self.assertEqual(res.rc, 0, res)
        self.assertFalse(os.path.exists(err_file))


class SummaryJsonTest(DdprunTestCase):
    def check_worker_fields(self, w):
        for k in ("attempt", "rank", "local_rank", "pid", "state", "exit_code", "signal", "start", "end"):
            self.assertIn(k, w)
        self.assertGreater(w["pid"], 0)
        self.assertLessEqual(w["start"], w["end"])

    def test_failure_with_restarts(self):
        path = self.path("summary.json")
        res = self.run_ddprun(["--nproc-per-node", "2", "--max-restarts", "1", "--summary-json", path,
                               worker("exit_code.sh"), "3"])
        self.assertEqual(res.rc, 3, res)
        j = self.load_json(path)
        self.assertEqual(j["status"], "failed")
        self.assertEqual(j["reason"], "worker_failed")
        self.assertNotIn("message", j)
        self.assertEqual(j["exit_code"], 3)
        self.assertEqual(j["restarts"], 1)
        self.assertLessEqual(j["start"], j["end"])
        ws = j["workers"]
        self.assertEqual(sorted((w["attempt"], w["rank"]) for w in ws), [(0, 0), (0, 1), (1, 0), (1, 1)])
        for w in ws:
            self.check_worker_fields(w)
            if w["rank"] == 1:
                self.assertEqual(w["state"], "failed")
                self.assertEqual(w["exit_code"], 3)
                self.assertIsNone(w["signal"])
            else:
                # rank 0 exits 0 at once; under heavy load rank 1 may fail first and ddprun stops it.
                self.assertIn(w["state"], ("succeeded", "stopped"), w)
                if w["state"] == "succeeded":
                    self.assertEqual(w["exit_code"], 0)
                else:
                    self.assertTrue(w["stopped_by_ddprun"])
        self.assertEqual(j["root_cause"]["rank"], 1)
        self.assertEqual(j["root_cause"]["attempt"], 1)
        self.assertIn("rank 1 giving up", j["root_cause"]["traceback"])

    def test_signal_death_and_stopped_siblings(self):
        path = self.path("summary.json")
        res = self.run_ddprun(["--nproc-per-node", "3", "--summary-json", path, worker("fail_one.py"), self.tmp,
                               "2", "signal:9"])
        self.assertEqual(res.rc, 137, res)
        j = self.load_json(path)
        by_rank = {w["rank"]: w for w in j["workers"]}
        self.assertEqual(by_rank[2]["signal"], "SIGKILL")
        self.assertEqual(by_rank[2]["state"], "failed")
        for r in (0, 1):
            self.assertEqual(by_rank[r]["state"], "stopped")
            self.assertTrue(by_rank[r]["stopped_by_ddprun"])
            self.assertEqual(by_rank[r]["signal"], "SIGTERM")
        self.assertEqual(j["root_cause"]["rank"], 2)

    def test_success(self):
        path = self.path("summary.json")
        res = self.run_ddprun(["--nproc-per-node", "2", "--summary-json", path, worker("lines.py"), "s"])
        self.assertEqual(res.rc, 0, res)
        j = self.load_json(path)
        self.assertEqual(j["status"], "succeeded")
        self.assertEqual(j["reason"], "succeeded")
        self.assertEqual(j["exit_code"], 0)
        self.assertEqual(j["restarts"], 0)
        self.assertIsNone(j["root_cause"])
        self.assertEqual(len(j["workers"]), 2)
        for w in j["workers"]:
            self.check_worker_fields(w)
            self.assertEqual(w["state"], "succeeded")

    def test_ddprun_signalled(self):
        path = self.path("summary.json")
        p = self.start(["--nproc-per-node", "2", "--summary-json", path, worker("signals.py"), self.tmp, "term"])
        self.wait_for_files([self.path(f"ready_{r}") for r in range(2)])
        os.kill(p.pid, signal.SIGTERM)
        self.assertEqual(p.wait(timeout=scaled(60)), 143)
        j = self.load_json(path)
        self.assertEqual(j["status"], "signaled")
        self.assertEqual(j["reason"], "signal")
        self.assertEqual(j["signal"], "SIGTERM")
        self.assertEqual(j["exit_code"], 143)

    def test_a_worker_killed_by_a_signal_has_no_exit_code_0(self):
        """Its record says -9 for SIGKILL (the failure summary's exitcode, torchrun's); a
        scheduler that reads exit_code == 0 as success must not count it. error_file is
        there only where the worker wrote one."""
        path = self.path("summary.json")
        script = self.path("rank1_killed.sh")  # (in a file: ddprun's arguments take `$$` as `$`, as torchrun's)
        with open(script, "w") as f:
            f.write('if [ "$RANK" = 1 ]; then kill -KILL $$; fi; sleep 30\n')
        res = self.run_ddprun(["--nproc-per-node", "2", "--summary-json", path, "--no-python", "sh", script])
        self.assertEqual(res.rc, 137, res)
        self.assertIn("exitcode  : -9 (pid: ", res.stderr)
        ws = {w["rank"]: w for w in self.load_json(path)["workers"]}
        self.assertEqual((ws[1]["state"], ws[1]["exit_code"], ws[1]["signal"]), ("failed", -9, "SIGKILL"), ws[1])
        self.assertEqual((ws[0]["state"], ws[0]["exit_code"], ws[0]["signal"]), ("stopped", -15, "SIGTERM"), ws[0])
        self.assertNotIn("error_file", ws[0])
        self.assertNotIn("error_file", ws[1])

    def test_summary_json_folders_are_made(self):
        path = self.path("new", "deeper", "summary.json")
        res = self.run_ddprun(["--summary-json", path, "--no-python", "/bin/true"])
        self.assertEqual(res.rc, 0, res)
        self.assertEqual(self.load_json(path)["status"], "succeeded")

    def test_summary_json_lost_after_a_success_is_no_success(self):
        # The place was writable at the start; the job removes it. ddprun's own failure: 1.
        folder = self.path("gone")
        os.mkdir(folder)
        path = os.path.join(folder, "summary.json")
        res = self.run_ddprun(["--summary-json", path, "--no-python", "rmdir", folder])
        self.assertEqual(res.rc, 1, res)
        self.assertFalse(os.path.exists(folder), "the job did not succeed")
        self.assertNotIn("FAILED", res.stderr)
        self.assertIn(f"cannot write --summary-json {path}: No such file or directory", res.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
