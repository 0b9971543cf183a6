"""Issue 2: the environment every rank sees (torchrun's variables), --standalone and
static rendezvous, PET_ fallbacks, ${local_rank} and -m."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_testlib import DdprunTestCase, clean_env, free_port, worker, WORKERS

TORCHRUN_VARS = ["RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
                 "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                 "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING"]


class EnvTest(DdprunTestCase):
    def dump(self, n):
        envs = {}
        for r in range(n):
            path = self.path(f"env_{r}.json")
            self.assertTrue(os.path.exists(path), f"rank {r} wrote no environment")
            with open(path) as f:
                envs[r] = json.load(f)
        extra = [f for f in os.listdir(self.tmp) if f.startswith("env_") and f not in {f"env_{r}.json" for r in range(n)}]
        self.assertEqual(extra, [], "unexpected ranks")
        return envs

    def check_agent_store(self, e):
        """TORCHELASTIC_USE_AGENT_STORE=True promises a store at MASTER_ADDR:MASTER_PORT that the
        workers join as clients (torch then starts no server of its own)."""
        use = e["env"]["TORCHELASTIC_USE_AGENT_STORE"]
        self.assertIn(use, ("True", "False"))
        if use == "True":
            self.assertTrue(e["store_reachable"], "USE_AGENT_STORE=True but nothing listens at MASTER_ADDR:MASTER_PORT")

    def test_standalone_four_ranks(self):
        env = clean_env(MY_INHERITED_VAR="kept-as-is")
        res = self.run_ddprun(["--standalone", "--nproc-per-node", "4", worker("env_dump.py"), self.tmp], env=env)
        self.assertEqual(res.rc, 0, res)
        envs = self.dump(4)
        ports = {e["env"]["MASTER_PORT"] for e in envs.values()}
        run_ids = {e["env"]["TORCHELASTIC_RUN_ID"] for e in envs.values()}
        self.assertEqual(len(ports), 1, f"ranks disagree on MASTER_PORT: {ports}")
        self.assertEqual(len(run_ids), 1, f"ranks disagree on the run id: {run_ids}")
        port = int(ports.pop())
        self.assertTrue(1024 <= port <= 65535, port)
        run_id = run_ids.pop()
        self.assertNotEqual(run_id, "none", "--standalone makes a random run id")
        self.assertRegex(run_id, r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
        error_files = set()
        for r, e in envs.items():
            v = e["env"]
            with self.subTest(rank=r):
                for k in TORCHRUN_VARS:
                    self.assertIn(k, v, f"rank {r} lacks {k}")
                self.assertEqual(v["RANK"], str(r))
                self.assertEqual(v["LOCAL_RANK"], str(r))
                self.assertEqual(v["GROUP_RANK"], "0")
                self.assertEqual(v["ROLE_RANK"], str(r))
                self.assertEqual(v["ROLE_NAME"], "default")
                self.assertEqual(v["LOCAL_WORLD_SIZE"], "4")
                self.assertEqual(v["WORLD_SIZE"], "4")
                self.assertEqual(v["GROUP_WORLD_SIZE"], "1")
                self.assertEqual(v["ROLE_WORLD_SIZE"], "4")
                self.assertEqual(v["MASTER_ADDR"], "localhost")
                self.assertEqual(v["TORCHELASTIC_RESTART_COUNT"], "0")
                self.assertEqual(v["TORCHELASTIC_MAX_RESTARTS"], "0")
                self.check_agent_store(e)
                self.assertEqual(v["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1")
                self.assertEqual(v["OMP_NUM_THREADS"], "1")
                self.assertEqual(v["MY_INHERITED_VAR"], "kept-as-is")
                self.assertTrue(v["TORCHELASTIC_ERROR_FILE"].endswith(f"/attempt_0/{r}/error.json"),
                                v["TORCHELASTIC_ERROR_FILE"])
                error_files.add(v["TORCHELASTIC_ERROR_FILE"])
        self.assertEqual(len(error_files), 4)
        # torchrun's warning about OMP_NUM_THREADS, once.
        self.assertEqual(res.stderr.count("OMP_NUM_THREADS"), 1, res)

    def test_static_rendezvous(self):
        port = free_port()
        res = self.run_ddprun(["--nnodes", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
                               "--nproc-per-node", "2", "--role", "trainer", "--max-restarts", "2",
                               worker("env_dump.py"), self.tmp])
        self.assertEqual(res.rc, 0, res)
        envs = self.dump(2)
        for r, e in envs.items():
            v = e["env"]
            with self.subTest(rank=r):
                self.assertEqual(v["MASTER_ADDR"], "127.0.0.1")
                self.assertEqual(v["MASTER_PORT"], str(port))
                self.assertEqual(v["ROLE_NAME"], "trainer")
                self.assertEqual(v["TORCHELASTIC_MAX_RESTARTS"], "2")
                self.assertEqual(v["TORCHELASTIC_RUN_ID"], "none")
                self.assertEqual(v["WORLD_SIZE"], "2")
                self.check_agent_store(e)

    def test_inherited_omp_num_threads_kept(self):
        env = clean_env(OMP_NUM_THREADS="3")
        res = self.run_ddprun(["--standalone", "--nproc-per-node", "2", worker("env_dump.py"), self.tmp], env=env)
        self.assertEqual(res.rc, 0, res)
        for r, e in self.dump(2).items():
            self.assertEqual(e["env"]["OMP_NUM_THREADS"], "3")
        self.assertNotIn("OMP_NUM_THREADS", res.stderr, "no warning when the user set it")

    def test_workers_keep_the_open_files_limit_ddprun_was_given(self):
        # ddprun's store raises its own soft limit to the hard one; the workers got it too
        # (a container's 1024 became 20000), where torchrun's keep the limit they were given.
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and hard <= 256:
            self.skipTest(f"a hard limit of {hard}: nothing to lower below it")
        for args in (["--standalone"], ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0"]):
            with self.subTest(args=args):
                res = self.run_ddprun([*args, "--nproc-per-node", "2", "--no-python", "sh", "-c", "ulimit -Sn"],
                                      cmd_prefix=("/usr/bin/python3", "-c", "import os, resource, sys; "
                                                  f"resource.setrlimit(resource.RLIMIT_NOFILE, (256, {hard})); "
                                                  "os.execv(sys.argv[1], sys.argv[1:])"))
                self.assertEqual(res.rc, 0, res)
                self.assertEqual(sorted(res.stdout.splitlines()), ["[rank0]:256", "[rank1]:256"], res)

    def test_single_worker_leaves_omp_unset(self):
        res = self.run_ddprun(["--standalone", worker("env_dump.py"), self.tmp])
        self.assertEqual(res.rc, 0, res)
        self.assertNotIn("OMP_NUM_THREADS", self.dump(1)[0]["env"])

    def test_pet_environment_fallbacks(self):
        port = free_port()
        env = clean_env(PET_NPROC_PER_NODE="3", PET_MASTER_PORT=str(port))
        res = self.run_ddprun([worker("env_dump.py"), self.tmp], env=env)
        self.assertEqual(res.rc, 0, res)
        envs = self.dump(3)
        self.assertEqual({e["env"]["MASTER_PORT"] for e in envs.values()}, {str(port)})
        self.assertEqual(envs[2]["env"]["WORLD_SIZE"], "3")

    def test_command_line_beats_pet(self):
        env = clean_env(PET_NPROC_PER_NODE="3")
        res = self.run_ddprun(["--nproc_per_node=2", "--standalone", worker("env_dump.py"), self.tmp], env=env)
        self.assertEqual(res.rc, 0, res)
        self.dump(2)

    def test_local_rank_replaced_and_args_passed(self):
        res = self.run_ddprun(["--standalone", "--nproc-per-node", "2", worker("env_dump.py"), self.tmp,
                               "--out=${local_rank}.txt", "--nproc-per-node", "9"])
        self.assertEqual(res.rc, 0, res)
        for r, e in self.dump(2).items():
            self.assertEqual(e["argv"][1:], [self.tmp, f"--out={r}.txt", "--nproc-per-node", "9"])

    def test_local_rank_by_template_rules_as_torchrun(self):
        """The same argv as torchrun 1.13/2.6 gave (string.Template.safe_substitute)."""
        res = self.run_ddprun(["--standalone", "--nproc-per-node", "2", worker("env_dump.py"), self.tmp,
                               "a$$b", "$local_rank/x", "p=$local_rank", "$${local_rank}"])
        self.assertEqual(res.rc, 0, res)
        for r, e in self.dump(2).items():
            self.assertEqual(e["argv"][1:], [self.tmp, "a$b", f"{r}/x", f"p={r}", "${local_rank}"])

    def test_run_path_takes_precedence_over_no_python(self):
        """As torchrun's --run_path ("takes precedence over --no_python"); ddprun refused the pair."""
        res = self.run_ddprun(["--standalone", "--run-path", "--no-python", worker("env_dump.py"), self.tmp])
        self.assertEqual(res.rc, 0, res)
        self.assertIn(b"--run-path takes precedence over --no-python", res.err)
        self.dump(1)
        # Before --preload is weighed: the workers run Python, so the modules are imported.
        res = self.run_ddprun(["--standalone", "--run-path", "--no-python", "--preload", "json",
                               worker("env_dump.py"), self.tmp])
        self.assertEqual(res.rc, 0, res)

    def test_module(self):
        env = clean_env(PYTHONPATH=WORKERS)
        res = self.run_ddprun(["--standalone", "--nproc-per-node", "2", "-m", "env_dump", self.tmp], env=env)
        self.assertEqual(res.rc, 0, res)
        self.dump(2)

    def test_no_python_shell_command(self):
        res = self.run_ddprun(["--standalone", "--nproc-per-node", "2", "--no-python", "sh", "-c",
                               'echo "$RANK $LOCAL_RANK $WORLD_SIZE" > "$0/rank_$RANK"', self.tmp])
        self.assertEqual(res.rc, 0, res)
        for r in range(2):
            with open(self.path(f"rank_{r}")) as f:
                self.assertEqual(f.read().strip(), f"{r} {r} 2")


    def test_executable_python_files_run_under_python_exec_and_shell_scripts_directly(self):
        """As torchrun: an executable Python file, without `.py`, with or without its own
        `#!/usr/bin/env python3`, runs as `$PYTHON_EXEC -u file` (a file without `#!` failed
        with "Exec format error"; one with `#!` ran another python, buffered). A shell script
        runs as it is."""
        probe = "import sys\nprint('PY', sys.executable, sys.stdout.write_through, sys.argv[1:], flush=True)\n"
        for name, head in (("train_noext", ""), ("train_sb", "#!/usr/bin/env python3\n")):
            path = self.path(name)
            with open(path, "w") as f:
                f.write(head + probe)
            os.chmod(path, 0o755)
            res = self.run_ddprun(["--standalone", path, "a"])
            self.assertEqual(res.rc, 0, res)
            self.assertIn(f"[rank0]:PY {clean_env()['PYTHON_EXEC']} True ['a']", res.stdout)
        path = self.path("run.sh")
        with open(path, "w") as f:
            f.write('#!/bin/sh\necho "SH $RANK $1"\n')
        os.chmod(path, 0o755)
        res = self.run_ddprun(["--standalone", path, "b"])
        self.assertEqual(res.rc, 0, res)
        self.assertIn("[rank0]:SH 0 b", res.stdout)

@unittest.skipUnless({0, 1} <= os.sched_getaffinity(0), "needs CPUs 0 and 1")
class NumaBindingTest(DdprunTestCase):
    """--numa-binding on a made-up machine (DDPRUN_TEST_SYSFS: a sysfs tree and the GPUs'
    PCI addresses) whose NUMA node 0 is CPU 0 and node 1 CPU 1, a GPU on each: the worker
    of local rank r runs on CPU r, its threads too, restarts too (the modes themselves:
    test_numa.cpp)."""

    def machine(self):
        root = self.path("sys")
        files = {"gpus": "0000:10:00.0\n0000:11:00.0\n", "devices/system/node/possible": "0-1\n"}
        for n in range(2):
            files[f"devices/system/node/node{n}/cpulist"] = f"{n}\n"
            files[f"bus/pci/devices/0000:1{n}:00.0/numa_node"] = f"{n}\n"
            files[f"devices/system/cpu/cpu{n}/topology/thread_siblings_list"] = f"{n}\n"  # (exclusive)
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        return root

    def cpus(self, rank, attempt):
        with open(self.path(f"cpus_{rank}_{attempt}")) as f:
            return f.read().splitlines()

    def test_each_rank_runs_near_its_gpu_and_so_do_its_threads_and_restarts(self):
        env = clean_env(DDPRUN_TEST_SYSFS=self.machine())
        res = self.run_ddprun(["--standalone", "--nproc-per-node", "2", "--numa-binding", "node", "--max-restarts",
                               "1", "--log-level", "info", worker("affinity.py"), self.tmp, "1"], env=env)
        self.assertEqual(res.rc, 0, res)
        for attempt in (0, 1):
            for r in range(2):
                with self.subTest(rank=r, attempt=attempt):
                    self.assertEqual(self.cpus(r, attempt), [f"[{r}]", f"[{r}]", str(r)])
        self.assertIn("--numa-binding: local rank 1 runs on CPUs 1", res.stderr)

    def test_a_program_run_directly_and_the_environment_spelling(self):
        env = clean_env(DDPRUN_TEST_SYSFS=self.machine(), PET_NUMA_BINDING="exclusive")
        res = self.run_ddprun(["--standalone", "--nproc-per-node", "2", "--no-python", "sh", "-c",
                               'grep Cpus_allowed_list: /proc/self/status > "$0/allowed_$RANK"', self.tmp], env=env)
        self.assertEqual(res.rc, 0, res)
        for r in range(2):
            with open(self.path(f"allowed_{r}")) as f:
                self.assertEqual(f.read().split(), ["Cpus_allowed_list:", str(r)])

    def test_without_a_gpu_it_is_a_usage_error_and_nothing_starts(self):
        env = clean_env(CUDA_VISIBLE_DEVICES="")
        res = self.run_ddprun(["--standalone", "--numa-binding", "node", worker("affinity.py"), self.tmp], env=env)
        self.assertEqual(res.rc, 2, res)
        self.assertEqual(res.stderr.splitlines(), [
            "ddprun: error: --numa-binding: binds each worker to the CPUs near its GPU, but no GPU is visible "
            "(CUDA_VISIBLE_DEVICES, driver)"])
        self.assertEqual([f for f in os.listdir(self.tmp) if f.startswith("cpus_")], [])

    def test_more_workers_than_gpus_is_a_usage_error(self):
        env = clean_env(DDPRUN_TEST_SYSFS=self.machine())
        res = self.run_ddprun(["--standalone", "--nproc-per-node", "3", "--numa-binding", "socket",
                               worker("affinity.py"), self.tmp], env=env)
        self.assertEqual(res.rc, 2, res)
        self.assertEqual(res.stderr.splitlines(), [
            "ddprun: error: --numa-binding: 3 workers but 2 GPUs visible: local rank 2 has no GPU to bind near"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
