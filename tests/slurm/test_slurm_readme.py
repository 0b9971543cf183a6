#!/usr/bin/python3
"""The README's Slurm block exactly as written, as a batch script:

    #SBATCH --nodes=4 --ntasks-per-node=1 --gpus-per-node=8
    srun ddprun --nproc-per-node gpu train.py

on a real Slurm cluster of four slurmd on this host, each with 8 stand-in GPUs (gres/gpu on
device files: Slurm's bookkeeping, not real GPUs). `ddprun` is found on PATH (build/bin) and
`train.py` in the job's folder: a stand-in that records each worker's environment (32
workers on 2 cores: no torch). ddprun takes the node count, the node rank, the store host and
port, the run id and 8 workers per node from the step, as the README says.
"""
import os
import re

import slurm_testlib as lib

TRAIN_STANDIN = """\
import json, os, socket
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_RUN_ID", "SLURMD_NODENAME", "SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES")
rec = {k: os.environ.get(k) for k in keys}
rec["hostname"] = socket.gethostname()
with open(f"where_{rec['RANK']}.json.tmp", "w") as f:
    json.dump(rec, f)
os.replace(f"where_{rec['RANK']}.json.tmp", f"where_{rec['RANK']}.json")
"""


def readme_block():
    with open(os.path.join(lib.SOURCE_DIR, "README.md")) as f:
        text = f.read()
    section = text[text.index("\n## Slurm\n"):]
    start = section.index("```sh\n") + 6
    return section[start:section.index("```", start)]


class SlurmReadme(lib.SlurmTestCase):
    NODES = 4
    GPUS = 8

    def test_the_readmes_slurm_lines_as_written(self):
        block = readme_block()
        self.assertEqual(len(block.strip().splitlines()), 2, block)
        name = "readme"
        d = self.job_dir(name)
        with open(os.path.join(d, "train.py"), "w") as f:
            f.write(TRAIN_STANDIN)
        path = os.path.dirname(lib.DDPRUN) + ":" + os.environ.get("PATH", "/usr/bin:/bin")
        env = self.cluster.env(PATH=path, PYTHON_EXEC="/usr/bin/python3", PYTHONDONTWRITEBYTECODE=1)
        env["SRUN_EXPORT_ENV"] = f"ALL,{lib.STEP_MARKER}={self.step_marker(name)}"
        job = self.cluster.sbatch("#!/bin/bash\n" + block, name=name, env=env)
        info = self.cluster.wait(job, lib.scaled(180))
        out = self.job_output(name)
        self.assertEqual((info["JobState"], info["ExitCode"]), ("COMPLETED", "0:0"), out)
        where = {int(r["RANK"]): r for r in self.read_json_files(name, "where_")}
        self.assertEqual(sorted(where), list(range(32)), out)
        nodes = ["n1", "n2", "n3", "n4"]
        for rank, r in where.items():
            self.assertEqual((r["WORLD_SIZE"], r["LOCAL_WORLD_SIZE"]), ("32", "8"), r)
            self.assertEqual((r["GROUP_RANK"], r["LOCAL_RANK"]), (str(rank // 8), str(rank % 8)), r)
            self.assertEqual((r["SLURMD_NODENAME"], r["hostname"]), (nodes[rank // 8],) * 2, r)
            self.assertEqual(r["MASTER_ADDR"], "n1", r)  # the step's first node
            self.assertEqual(r["MASTER_PORT"], str(lib.derived_port(job, 0)), r)
            self.assertEqual(r["TORCHELASTIC_RUN_ID"], f"{job}.0", r)
            self.assertEqual(r["SLURM_JOB_ID"], str(job), r)
            # as under torchrun, every worker sees the step's eight and takes cuda:LOCAL_RANK
            self.assertEqual(r["CUDA_VISIBLE_DEVICES"], "0,1,2,3,4,5,6,7", r)
        # ddprun's only remark is torchrun's: OMP_NUM_THREADS=1 for each worker (once per node)
        remarks = [l for l in out.splitlines() if re.search(r"warn|error", l, re.I)]
        self.assertEqual(len(remarks), 4, out)
        self.assertTrue(all("OMP_NUM_THREADS is not set" in l for l in remarks), out)
        self.assert_nothing_left(name)


if __name__ == "__main__":
    lib.main()
