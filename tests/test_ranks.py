"""A watched loader knows its place in a torchrun job (rank, node, world size, job id), read
from what torchrun tells each rank; every rank's run lands in the history, grouped by job."""

import os
import subprocess
import sys

import pytest

from engine import RunStore
from engine.watcher.ranks import RankIdentity, rank_identity

from .browser import free_port
from .conftest import ROOT


def test_identity_comes_from_torchrun_s_environment():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
           "GROUP_RANK": "1", "TORCHELASTIC_RUN_ID": "job-7"}
    assert rank_identity(env) == RankIdentity(5, 8, 1, 4, 1, "job-7")
    assert rank_identity({}) is None  # not a torchrun job
    assert rank_identity({"RANK": "x", "WORLD_SIZE": "2"}) is None  # nothing believable
    assert rank_identity({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                          "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}) == RankIdentity(
        3, 4, 3, 2, 1, "10.0.0.1:29500")  # without GROUP_RANK: the node from the local size


SCRIPT = """
import sys
import torch
from torch.utils.data import DataLoader
from engine import watch

loader = watch(DataLoader(torch.arange(64).float().view(-1, 1), batch_size=8), name="train",
               db=sys.argv[1])
for batch in loader:
    pass
loader.close()
"""


@pytest.mark.slow
def test_every_rank_of_a_torchrun_job_is_recorded_with_its_place(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    db = str(tmp_path / "runs.sqlite")
    port = free_port()
    env = dict(os.environ, PYTHONPATH=ROOT, GLOO_SOCKET_IFNAME="lo")
    job = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
         "--local-addr", "127.0.0.1", "--rdzv-id", "watched-job", str(script), db],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    runs = sorted(RunStore(db).list_runs(), key=lambda run: run.rank["rank"])
    assert [run.rank["rank"] for run in runs] == [0, 1]
    assert {run.rank["world_size"] for run in runs} == {2}
    assert {run.rank["node_rank"] for run in runs} == {0}
    assert len({run.rank["job_id"] for run in runs}) == 1  # one job
    assert len({run.pid for run in runs}) == 2 and all(run.status == "ok" for run in runs)
