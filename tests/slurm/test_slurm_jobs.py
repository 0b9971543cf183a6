#!/usr/bin/python3
"""`srun ddprun train.py` on a real Slurm cluster (three slurmd on this host, proctrack/cgroup):
every job is an sbatch job; the training ones are 4-rank gloo DDP jobs of Debian's torch 1.13,
and (slurm.test_slurm_jobs.torch2, DDP_TORCH=torch2) those marked @torch_workers again on
torch 2.6: the derived static line, the c10d line and preemption with requeue.

- no rendezvous flags: ranks, hosts, store address and port all come from the step;
- the static line users already have, and the classic mistake in it (the node rank expanded
  in the batch shell): a warning naming both values and a clear failure, not a hang;
- the c10d line (pytorch/examples'): SLURM_NODEID 0 hosts the store, the other node joins;
  examples/slurm/c10d.sbatch trains and saves through it;
- the etcd line: node count and run id from the step, as for c10d;
- a step on 2 of the job's 3 nodes meets on the step's first node; a heterogeneous step on
  its first component's first node (node rank 0), not its sorted list's;
- a worker exiting 3 on the second node stops both nodes; Slurm records 3 (static and c10d);
- two jobs sharing their nodes at the same time, no flags: no port clash;
- ddprun in the batch shell, and several tasks per node: a clear warning.
"""
import os
import re
import sys
import time

import slurm_testlib as lib
import etcd_cluster  # noqa: E402 (tests/testlib, on the path through slurm_testlib)


class SlurmJobs(lib.SlurmTestCase):
    NEEDS_TORCH = True
    GPUS = 2

    def where(self, name):
        recs = self.read_json_files(name, "where_")
        return {int(r["RANK"]): r for r in recs}

    def assert_four_ranks_on(self, name, job, nodes, master):
        where = self.where(name)
        self.assertEqual(sorted(where), [0, 1, 2, 3], self.job_output(name))
        for rank, r in where.items():
            node = nodes[rank // 2]
            self.assertEqual(r["WORLD_SIZE"], "4")
            self.assertEqual(r["LOCAL_RANK"], str(rank % 2))
            self.assertEqual(r["GROUP_RANK"], str(rank // 2))
            self.assertEqual(r["SLURMD_NODENAME"], node, r)
            self.assertEqual(r["hostname"], node, r)
            self.assertEqual(r["MASTER_ADDR"], master, r)
            self.assertEqual(r["SLURM_JOB_ID"], str(job))
        return where

    @lib.torch_workers
    def test_no_rendezvous_flags_two_nodes_train(self):
        name = "noflags"
        d = self.job_dir(name)
        job, info = self.run_job(name, f"""
srun --ntasks-per-node=1 $DDPRUN --log-level info --nproc-per-node 2 $WORKERS/where.py {d} \\
     --train --epochs 3 --checkpoint {d}/ckpt.pt""", "-N2")
        out = self.job_output(name)
        self.assertEqual((info["JobState"], info["ExitCode"]), ("COMPLETED", "0:0"), out)
        where = self.assert_four_ranks_on(name, job, ["n1", "n2"], "n1")
        # The port and run id derived from job and step (the batch script's first srun: step 0).
        self.assertEqual({r["MASTER_PORT"] for r in where.values()}, {str(lib.derived_port(job, 0))})
        self.assertEqual({r["TORCHELASTIC_RUN_ID"] for r in where.values()}, {f"{job}.0"})
        self.assertIn("epoch 2 loss", out)
        self.assertIn("parameters identical on all 4 ranks", out)
        self.assertGreater(os.path.getsize(os.path.join(d, "ckpt.pt")), 0)
        # One info line per node says what came from Slurm.
        self.assertEqual(out.count(f"Slurm step {job}.0 (SLURM_STEP_NODELIST=n[1-2]"), 2, out)
        self.assertIn("--node-rank 1 --master-addr n1", out)
        self.assert_nothing_left(name)

    @lib.torch_workers
    def test_preload_torch_two_nodes_train(self):
        """Issue 22: the same job with its workers forked from a warm process on each node."""
        name = "preload"
        d = self.job_dir(name)
        job, info = self.run_job(name, f"""
srun --ntasks-per-node=1 $DDPRUN --log-level info --preload torch --nproc-per-node 2 $WORKERS/where.py {d} \\
     --train --epochs 3""", "-N2")
        out = self.job_output(name)
        self.assertEqual((info["JobState"], info["ExitCode"]), ("COMPLETED", "0:0"), out)
        self.assert_four_ranks_on(name, job, ["n1", "n2"], "n1")
        self.assertEqual(out.count("--preload: imported torch in"), 2, out)
        self.assertIn("parameters identical on all 4 ranks", out)
        self.assert_nothing_left(name)

    def test_static_line_with_rank_and_master(self):
        name = "static"
        d = self.job_dir(name)
        port = lib.derived_port(self.cluster.first_job_id + 90, 5)  # this cluster's own range
        job, info = self.run_job(name, f"""
HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --ntasks-per-node=1 bash -c "exec $DDPRUN --nnodes 2 --node-rank \\$SLURM_NODEID --master-addr $HEAD \\
     --master-port {port} --nproc-per-node 2 $WORKERS/where.py {d} --train --epochs 2 --checkpoint {d}/ckpt.pt"
""", "-N2")
        out = self.job_output(name)
        self.assertEqual((info["JobState"], info["ExitCode"]), ("COMPLETED", "0:0"), out)
        where = self.assert_four_ranks_on(name, job, ["n1", "n2"], "n1")
        self.assertEqual({r["MASTER_PORT"] for r in where.values()}, {str(port)})  # explicit flags win
        self.assertNotIn("disagrees", out)
        self.assert_nothing_left(name)

    def test_static_line_rank_expanded_in_batch_shell(self):
        # The classic mistake: $SLURM_NODEID expands in the batch script (0 there), so every
        # node claims rank 0. ddprun names both values, and one node fails at once (here, on
        # one host, the second store cannot bind; on separate hosts the second node finds
        # rank 0 taken and aborts the rendezvous for all). --kill-on-bad-exit ends the step.
        name = "rank0everywhere"
        port = lib.derived_port(self.cluster.first_job_id + 91, 5)
        job, info = self.run_job(name, f"""
srun --kill-on-bad-exit=1 --ntasks-per-node=1 $DDPRUN --nnodes 2 --node-rank $SLURM_NODEID \\
     --master-port {port} --nproc-per-node 1 --no-python true
""", "-N2", timeout=90)
        out = self.job_output(name)
        self.assertIn("--node-rank 0 disagrees with SLURM_NODEID=1", out)
        # Both nodes claim rank 0: the second is refused (on one host, at binding the port).
        self.assertTrue("is taken by two nodes" in out or "already in use" in out, out)
        self.assertEqual(info["JobState"], "FAILED", out)
        self.assert_nothing_left(name)

    def c10d_line(self, port, rest):
        """pytorch/examples' c10d line, the endpoint the job's first node by its fully
        qualified name (the emulated nodes share one network namespace, so torchrun's
        address matching would make every node think the endpoint is its own)."""
        return f"""
HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --ntasks-per-node=1 $DDPRUN --log-level info --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \\
     --rdzv-endpoint $HEAD.{lib.DOMAIN}:{port} --rdzv-id $SLURM_JOB_ID {rest}
"""

    def test_c10d_line(self):
        name = "c10d"
        d = self.job_dir(name)
        port = lib.derived_port(self.cluster.first_job_id + 92, 5)
        # Placement only: test_example_c10d trains a DDP model through the same line.
        job, info = self.run_job(name, self.c10d_line(port, f"$WORKERS/where.py {d}"), "-N2")
        out = self.job_output(name)
        self.assertEqual((info["JobState"], info["ExitCode"]), ("COMPLETED", "0:0"), out)
        where = self.where(name)
        self.assertEqual(sorted(where), [0, 1, 2, 3], out)
        for rank, r in where.items():
            self.assertEqual(r["WORLD_SIZE"], "4", r)
            self.assertEqual(r["TORCHELASTIC_RUN_ID"], str(job), r)
            self.assertEqual(r["SLURM_JOB_ID"], str(job), r)
        # Each node's two ranks are on that node, and node n1 (SLURM_NODEID 0) hosts the store:
        # is_host comes from SLURM_NODEID, not from matching names or addresses.
        by_node = {}
        for rank, r in where.items():
            by_node.setdefault(r["SLURMD_NODENAME"], set()).add(r["GROUP_RANK"])
        self.assertEqual(sorted(by_node), ["n1", "n2"], where)
        self.assertTrue(all(len(g) == 1 for g in by_node.values()), where)
        self.assertEqual(out.count(f"is_host=1 (the endpoint n1.{lib.DOMAIN} is the step's first node n1; "
                                   "this is node 0)"), 1, out)
        self.assertEqual(out.count(f"is_host=0 (the endpoint n1.{lib.DOMAIN} is the step's first node n1; "
                                   "this is node 1)"), 1, out)
        self.assertEqual(out.count("this node hosts the c10d store on port"), 1, out)
        self.assertEqual(out.count("joining the c10d store at"), 1, out)
        self.assert_nothing_left(name)

    def test_c10d_without_an_endpoint_meets_on_the_steps_first_node(self):
        # `--rdzv-backend c10d` and no endpoint in a 2-node step: the step's first node hosts
        # the store at the derived port (before: each node ran a 1-node job of its own, world
        # size 2 instead of 4, and the step succeeded).
        name = "c10d_noendpoint"
        d = self.job_dir(name)
        job, info = self.run_job(name, f"""
srun --ntasks-per-node=1 $DDPRUN --log-level info --rdzv-backend c10d --nproc-per-node 2 $WORKERS/where.py {d}""",
                                 "-N2")
        out = self.job_output(name)
        self.assertEqual((info["JobState"], info["ExitCode"]), ("COMPLETED", "0:0"), out)
        where = self.where(name)
        self.assertEqual(sorted(where), [0, 1, 2, 3], out)
        for r in where.values():
            self.assertEqual(r["WORLD_SIZE"], "4", r)
            self.assertEqual(r["TORCHELASTIC_RUN_ID"], f"{job}.0", r)
        self.assertEqual(out.count(f"--rdzv-endpoint n1:{lib.derived_port(job, 0)} --nnodes 2"), 2, out)
        self.assertEqual(out.count("this node hosts the c10d store on port"), 1, out)
        self.assert_nothing_left(name)

    def test_c10d_worker_exit_3_stops_both(self):
        name = "c10d_exit3"
        port = lib.derived_port(self.cluster.first_job_id + 93, 5)
        job, info = self.run_job(name, self.c10d_line(port, "$WORKERS/exit_on_node.py 1 3"), "-N2", timeout=60)
        out = self.job_output(name)
        self.assertEqual((info["JobState"], info["ExitCode"]), ("FAILED", "3:0"), out)
        self.assertIn("on node 1: exiting with 3", out)
        self.assertIn("the job failed on another node", out)  # the other node stopped because of it
        self.assertLess(lib.seconds(info["RunTime"]), 30, info)  # not the other workers' 120 s
        self.assert_nothing_left(name)

    def test_etcd_line_takes_node_count_and_run_id_from_the_step(self):
        # --rdzv-backend etcd with no --nnodes and no --rdzv-id: both come from the step, so
        # two jobs on one etcd never meet in one run id (torchrun's default id is "none").
        if not etcd_cluster.find_etcd():
            self.skipTest("no etcd binary (Debian package etcd-server)")
        etcd = etcd_cluster.EtcdCluster(1)
        self.addCleanup(etcd.stop)
        name = "etcd"
        d = self.job_dir(name)
        job, info = self.run_job(name, f"""
srun --ntasks-per-node=1 $DDPRUN --log-level info --nproc-per-node 2 --rdzv-backend etcd \
     --rdzv-endpoint {etcd.endpoint(0)} $WORKERS/where.py {d}
""", "-N2")
        out = self.job_output(name)
        self.assertEqual((info["JobState"], info["ExitCode"]), ("COMPLETED", "0:0"), out)
        where = self.where(name)
        self.assertEqual(sorted(where), [0, 1, 2, 3], out)
        self.assertEqual({r["WORLD_SIZE"] for r in where.values()}, {"4"})
        self.assertEqual({r["TORCHELASTIC_RUN_ID"] for r in where.values()}, {f"{job}.0"})
        self.assertEqual(out.count(f"as if given --nnodes 2 --rdzv-id {job}.0 (--no-slurm"), 2, out)
        self.assert_nothing_left(name)

    def test_step_on_two_of_three_nodes_meets_on_its_first(self):
        name = "substep"
        d = self.job_dir(name)
        job, info = self.run_job(name, f"""
srun -N2 -w n2,n3 --ntasks-per-node=1 $DDPRUN --log-level info --nproc-per-node 2 $WORKERS/where.py {d}
""", "-N3")
        out = self.job_output(name)
        self.assertEqual((info["JobState"], info["ExitCode"]), ("COMPLETED", "0:0"), out)
        self.assert_four_ranks_on(name, job, ["n2", "n3"], "n2")  # not the job's first node, n1
        self.assertIn("SLURM_STEP_NODELIST=n[2-3]", out)
        self.assert_nothing_left(name)

    def test_heterogeneous_step_meets_on_its_first_components_node(self):
        """A heterogeneous job (components n3 and n1,n2) and one step over both: Slurm sorts
        the step's node list (n[1-3]) but numbers its nodes component by component, so node
        rank 0, the store's host, is n3. Before, every node and worker was told MASTER_ADDR=n1
        (nodes of one host reach each other's stores, so only the address showed it; on real
        hosts the rendezvous waited for join_timeout)."""
        name = "het"
        d = self.job_dir(name)
        job, info = self.run_job(name, f"""
srun --het-group=0,1 $DDPRUN --log-level info --nproc-per-node 1 $WORKERS/where.py {d}
""", "-N1", "-w", "n3", ":", "-N2", "-w", "n1,n2")
        out = self.job_output(name)
        self.assertEqual(info["JobState"], "COMPLETED", out)
        where = self.where(name)
        self.assertEqual(sorted(where), [0, 1, 2], out)
        self.assertEqual([where[r]["SLURMD_NODENAME"] for r in range(3)], ["n3", "n1", "n2"], out)
        self.assertEqual({r["MASTER_ADDR"] for r in where.values()}, {"n3"}, out)
        self.assertEqual(out.count("--master-addr n3"), 3, out)
        self.assertEqual(out.count(": all_reduce ok"), 3, out)  # where.py's, across the three nodes
        self.assert_nothing_left(name)

    def test_worker_exit_3_on_second_node_stops_both(self):
        name = "exit3"
        job, info = self.run_job(name, """
srun --ntasks-per-node=1 $DDPRUN --nproc-per-node 2 $WORKERS/exit_on_node.py 1 3
""", "-N2", timeout=60)
        out = self.job_output(name)
        self.assertEqual((info["JobState"], info["ExitCode"]), ("FAILED", "3:0"), out)
        self.assertIn("on node 1: exiting with 3", out)
        # node 0 stopped because node 1 failed
        self.assertRegex(out, r"the job failed on another node: node \S+ \(node rank 1, [^)]*\): rank 2 ")
        self.assertLess(lib.seconds(info["RunTime"]), 30, info)  # long before the others' 120 s sleep ended
        self.assert_nothing_left(name)

    def test_two_jobs_share_nodes_without_flags(self):
        meet = os.path.join(self.cluster.root, "jobs", "meet")
        os.makedirs(meet, exist_ok=True)
        jobs = {}
        for name in ("share_a", "share_b"):
            d = self.job_dir(name)
            # Each rank waits until all 8 ranks of both jobs are up: both stores are open at once.
            jobs[name] = self.submit(name, f"""
srun --ntasks-per-node=1 $DDPRUN --nproc-per-node 2 $WORKERS/where.py {d} --wait-for {meet} 8 \\
     --train --epochs 2 --checkpoint {d}/ckpt.pt""", "-N2", "-w", "n1,n2")
        ports = set()
        for name, job in jobs.items():
            info = self.cluster.wait(job, lib.scaled(240))
            out = self.job_output(name)
            self.assertEqual((info["JobState"], info["ExitCode"]), ("COMPLETED", "0:0"), out)
            where = self.assert_four_ranks_on(name, job, ["n1", "n2"], "n1")
            ports |= {r["MASTER_PORT"] for r in where.values()}
            self.assert_nothing_left(name)
        self.assertEqual(len(os.listdir(meet)), 8)
        self.assertEqual(len(ports), 2, ports)  # one store port per job, on the same node

    def test_nproc_gpu_counts_the_steps_gpus(self):
        # Each node has 2 (stand-in) GPUs; the job asks for 1 per node: 1 worker per node.
        name = "gpus"
        d = self.job_dir(name)
        job, info = self.run_job(name, f"""
srun --ntasks-per-node=1 $DDPRUN --log-level info --nproc-per-node gpu --no-python \\
     bash -c 'echo "$RANK $WORLD_SIZE $CUDA_VISIBLE_DEVICES" > {d}/rank_$RANK'
""", "-N2", "--gpus-per-node=1")
        out = self.job_output(name)
        self.assertEqual((info["JobState"], info["ExitCode"]), ("COMPLETED", "0:0"), out)
        self.assertEqual(sorted(f for f in os.listdir(d) if f.startswith("rank_")), ["rank_0", "rank_1"], out)
        self.assertEqual(self.read(name, "rank_1").split(), ["1", "2", "0"])
        self.assertIn("--nproc-per-node gpu: 1 worker, one per GPU (CUDA_VISIBLE_DEVICES=0)", out)
        # No GPU asked for: none counted (not the node's 2), and a clear error.
        job, info = self.run_job("nogpus", "srun $DDPRUN --nproc-per-node gpu --no-python true", "-N1")
        out = self.job_output("nogpus")
        self.assertEqual(info["ExitCode"], "2:0", out)
        self.assertIn("Slurm gave this job no GPU", out)

    def test_batch_shell_warns_and_runs_one_node(self):
        name = "batchshell"
        job, info = self.run_job(name, "$DDPRUN --nproc-per-node 2 --no-python true", "-N2")
        out = self.job_output(name)
        self.assertEqual((info["JobState"], info["ExitCode"]), ("COMPLETED", "0:0"), out)
        self.assertIn("ddprun runs in its batch script (or salloc shell), not in an srun step", out)
        self.assertIn("srun --ntasks-per-node=1 ddprun", out)

    def test_several_tasks_per_node_warn(self):
        name = "twotasks"
        job, info = self.run_job(name, "srun -N1 -n2 $DDPRUN --nproc-per-node 1 --no-python true", "-N1", "-n2")
        out = self.job_output(name)
        self.assertEqual((info["JobState"], info["ExitCode"]), ("COMPLETED", "0:0"), out)
        self.assertEqual(out.count("runs 2 tasks on 1 node"), 2, out)

    # ------------------------------------------------------------------ examples/slurm

    def submit_example(self, name, example, port=None, **env):
        """Submits examples/slurm/<example> as a user would (from that folder), minus its GPU
        request (this cluster has none) and with `port` for its fixed 29500 (the emulated
        nodes share this machine's ports); the job runs in its own folder."""
        with open(os.path.join(lib.SOURCE_DIR, "examples", "slurm", example)) as f:
            text = "".join(line for line in f if "--gpus-per-node" not in line)
        if port:
            self.assertIn(":29500", text)
            text = text.replace(":29500", f":{port}")
        path_env = os.path.dirname(lib.DDPRUN) + ":" + os.environ.get("PATH", "/usr/bin:/bin")
        job_env = self.cluster.env(PATH=path_env, PYTHON_EXEC=lib.PYTHON, OMP_NUM_THREADS=1,
                                   PYTHONUNBUFFERED=1, PYTHONDONTWRITEBYTECODE=1,
                                   TRAIN=lib.TRAIN, **env)
        job_env["SRUN_EXPORT_ENV"] = f"ALL,{lib.STEP_MARKER}={self.step_marker(name)}"
        return self.cluster.sbatch(text, name=name, env=job_env)

    def assert_example_trained(self, name, example, **submit):
        """The example job completed a 4-rank DDP training with a checkpoint, and left nothing.
        Run once more when it failed only by torch's exit race (torch_runtime.TORCH_EXIT_ABORT:
        a rank aborted in torch's exit after the training was done, and ddprun stopped the job,
        as it should; seen on torch 2.6 under load), saying so on stderr."""
        for attempt in range(2):
            if attempt:
                name += "_again"
            job = self.submit_example(name, example, **submit)
            info = self.cluster.wait(job, lib.scaled(180))
            out = self.job_output(name)
            if (attempt == 0 and info["ExitCode"] == "134:0" and lib.torch_runtime.TORCH_EXIT_ABORT in out
                    and "parameters identical on all 4 ranks" in out):
                print(f"\n{self.id()}: a worker aborted in torch's exit after the job was done; running it "
                      f"again:\n{out}", file=sys.stderr)
                self.assert_nothing_left(name)
                continue
            break
        self.assertEqual((info["JobState"], info["ExitCode"]), ("COMPLETED", "0:0"), out)
        self.assertIn("training on 4 ranks", out)
        self.assertIn("parameters identical on all 4 ranks", out)
        self.assertTrue(os.path.exists(os.path.join(self.job_dir(name), "checkpoint.pt")))
        self.assert_nothing_left(name)

    def test_example_multi_node(self):
        self.assert_example_trained("ex_multi", "multi_node.sbatch", NPROC=2)

    @lib.torch_workers
    def test_example_c10d(self):
        self.assert_example_trained("ex_c10d", "c10d.sbatch",
                                    port=lib.derived_port(self.cluster.first_job_id + 97, 5), NPROC=2)

    def run_preempted(self, name):
        """The preempt example, signalled once it trains: (its job id, its final state, its output)."""
        worker = os.path.join(lib.SOURCE_DIR, "examples", "slurm", "checkpoint_train.py")
        job = self.submit_example(name, "preempt.sbatch", NPROC=2, EPOCHS=30, WORKER=worker,
                                  WORKER_ARGS="--epoch-seconds 0.3")
        deadline = time.monotonic() + lib.scaled(120)
        while "epoch 3 loss" not in self.job_output(name):
            self.assertLess(time.monotonic(), deadline, self.job_output(name))
            time.sleep(0.2)
        self.cluster.run("scancel", "-s", "USR1", str(job))  # what --signal=USR1@120 sends
        deadline = time.monotonic() + lib.scaled(180)
        while True:
            info = self.cluster.job(job)
            if info["JobState"] in ("COMPLETED", "FAILED", "TIMEOUT") and int(info.get("Restarts", 0)) >= 1:
                break
            self.assertLess(time.monotonic(), deadline, f"{info}\n{self.job_output(name)}")
            time.sleep(0.2)
        return job, info, self.job_output(name)

    @lib.torch_workers
    def test_example_preempt_requeue_resumes(self):
        """Run once more when the resumed run failed only by torch's exit race (as
        assert_example_trained: a rank aborted in torch's exit after `done: 30 epochs`)."""
        name = "ex_preempt"
        job, info, out = self.run_preempted(name)
        if (info["ExitCode"] == "134:0" and lib.torch_runtime.TORCH_EXIT_ABORT in out
                and "done: 30 epochs" in out):
            print(f"\n{self.id()}: a worker aborted in torch's exit after the job was done; running it "
                  f"again:\n{out}", file=sys.stderr)
            self.assert_nothing_left(name)
            name += "_again"
            job, info, out = self.run_preempted(name)
        self.assertEqual((info["JobState"], info["ExitCode"]), ("COMPLETED", "0:0"), out)
        saved = re.search(r"SIGUSR1: saved epoch (\d+)", out)
        self.assertTrue(saved, out)
        self.assertIn("requeue requested (./checkpoint.pt.requeue)", out)
        self.assertIn(f"requeueing job {job}", out)  # by the batch script, after the step
        self.assertIn(f"run 1: starting at epoch {saved.group(1)} of 30", out)  # resumed, same job id
        self.assertIn("done: 30 epochs", out)
        self.assertEqual(info["Restarts"], "1")
        self.assert_nothing_left(name)


if __name__ == "__main__":
    lib.main()
