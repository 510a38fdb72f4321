"""A watched loader knows its place in a torchrun job (rank, node, world size, job id), read
from what torchrun tells each rank; every rank's run lands in the history, grouped by job."""

import os
import signal
import subprocess
import sys
import time

import pytest

from dataloader_tuner import RunStore
from dataloader_tuner.analyse.ranks import job_view
from dataloader_tuner.watcher.rank_identity import RankIdentity, rank_identity

from .browser import free_port
from .conftest import ROOT
from .jobs import run_job


def test_identity_comes_from_torchrun_s_environment():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
           "GROUP_RANK": "1", "TORCHELASTIC_RUN_ID": "job-7"}
    assert rank_identity(env) == RankIdentity(5, 8, 1, 4, 1, "job-7")
    assert rank_identity({}) is None  # not a torchrun job
    assert rank_identity({"RANK": "x", "WORLD_SIZE": "2"}) is None  # nothing believable
    assert rank_identity({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                          "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}) == RankIdentity(
        3, 4, 3, 2, 1, "10.0.0.1:29500")  # without GROUP_RANK: the node from the local size


def test_identity_comes_from_slurm_s_environment_without_torchrun():
    """``srun python train.py``: each task's place from SLURM_* (where torchrun's are unset)."""
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "7", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
           "SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "3"}
    assert rank_identity(env) == RankIdentity(5, 7, 1, 2, 2, "slurm-4242.3")
    last_node = {**env, "SLURM_PROCID": "6", "SLURM_LOCALID": "0", "SLURM_NODEID": "3"}
    assert rank_identity(last_node) == RankIdentity(6, 7, 0, 1, 3, "slurm-4242.3")
    # a batch script's own process: one task, no distributed job
    assert rank_identity({**env, "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None
    assert rank_identity({**env, "SLURM_NTASKS": "many"}) is None
    torchrun = {**env, "RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "t"}
    assert rank_identity(torchrun).job_id == "t"  # torchrun inside an allocation: its own


SCRIPT = """
import sys
import torch
from torch.utils.data import DataLoader
from dataloader_tuner import watch

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
    job = run_job(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
         "--local-addr", "127.0.0.1", "--rdzv-id", "watched-job", str(script), db],
        cwd=tmp_path, env=env, timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    runs = sorted(RunStore(db).list_runs(), key=lambda run: run.rank["rank"])
    assert [run.rank["rank"] for run in runs] == [0, 1]
    assert {run.rank["world_size"] for run in runs} == {2}
    assert {run.rank["node_rank"] for run in runs} == {0}
    assert len({run.rank["job_id"] for run in runs}) == 1  # one job
    assert len({run.pid for run in runs}) == 2 and all(run.status == "ok" for run in runs)


JOB = """
import os, signal, sys, time
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from dataloader_tuner import watch

def _read_shard(seconds):  # the slow rank's work: on the CPU, where its profile sees it
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

class Samples(Dataset):
    def __init__(self, delay, hang):
        self.delay, self.hang = delay, hang
    def __len__(self):
        return 100_000
    def __getitem__(self, i):
        if self.hang and i >= 800:
            time.sleep(600)
        elif self.delay:
            _read_shard(self.delay)
        return torch.tensor([float(i)])

db, slow_rank, kill_rank, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
hang_rank = int(sys.argv[5]) if len(sys.argv) > 5 else -1
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
loader = watch(DataLoader(Samples(0.002 if rank == slow_rank else 0.0, rank == hang_rank),
                          batch_size=4), name="train", db=db)
for i, batch in enumerate(loader):
    dist.all_reduce(batch.sum())  # the ranks meet at every step, as in data-parallel training
    time.sleep(0.002)
    if rank == kill_rank and i == batches // 2:
        os.kill(os.getpid(), signal.SIGKILL)
    if i + 1 == batches:
        break
loader.close()
dist.destroy_process_group()
"""


HANG_LINE = next(n for n, line in enumerate(JOB.splitlines(), 1) if "time.sleep(600)" in line)


def _torchrun(tmp_path, folder: str, args: list[str], job_args: list) -> subprocess.Popen:
    """One torchrun launch on loopback only, in its own folder (a "node")."""
    where = tmp_path / folder
    where.mkdir()
    script = where / "train.py"
    script.write_text(JOB)
    env = dict(os.environ, PYTHONPATH=ROOT, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--local-addr", "127.0.0.1", *args,
         str(script), *map(str, job_args)],
        cwd=where, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_two_nodes_rank_0_gathers_both_through_the_job_s_store_and_names_the_slow_rank(
        tmp_path):
    """Two torchrun launches (--nnodes 2, --node-rank 0 and 1) on 127.0.0.1, each with a
    history of its own, as two machines would have: node 0's history shows both ranks, and
    rank 1, whose samples are slow on purpose, as the straggler."""
    port = free_port()
    launches = [_torchrun(tmp_path, f"node{n}", [
        "--nnodes", "2", "--node-rank", str(n), "--nproc-per-node", "1",
        "--master-addr", "127.0.0.1", "--master-port", str(port)],
        [tmp_path / f"node{n}" / "runs.sqlite", 1, -1, 400]) for n in (0, 1)]
    outputs = [launch.communicate(timeout=240)[0] for launch in launches]
    assert [launch.returncode for launch in launches] == [0, 0], outputs
    node0, node1 = (RunStore(str(tmp_path / f"node{n}" / "runs.sqlite")) for n in (0, 1))
    [run0] = node0.list_runs()
    [run1] = node1.list_runs()
    assert (run0.rank["rank"], run1.rank["rank"]) == (0, 1)
    assert run0.rank["job_id"] == run1.rank["job_id"]
    latest = node0.rank_reports(run0.id)
    assert [(s.rank, s.node, s.status) for _, s in latest] == [(0, 0, "ok"), (1, 1, "ok")]
    assert latest[1][1].pid == run1.pid and latest[1][1].batches == 400
    assert node1.rank_reports(run1.id) == []  # only rank 0 gathers
    view = job_view(latest, run0.ended_at, collecting=False)
    assert view.straggler is not None and view.straggler[0] == 1, view
    assert "starved" in view.straggler[1]
    # ...and where its loader's time goes, sampled on its own node and told to rank 0
    assert "Its loader spends" in view.straggler[1] and "in _read_shard" in view.straggler[1]
    assert latest[1][1].stages and latest[1][1].top_functions[0][0] == "_read_shard"
    assert view.stages and view.stages[0][0] == "your __getitem__"
    assert [n.node for n in view.nodes] == [0, 1] and all(n.cpus for n in view.nodes)


@pytest.mark.slow
def test_a_killed_rank_is_shown_lost_while_the_job_s_other_records_survive(tmp_path):
    port = free_port()
    db = tmp_path / "node0" / "runs.sqlite"
    launch = _torchrun(tmp_path, "node0", [
        "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}"], [db, -1, 1, 2000])
    output = launch.communicate(timeout=240)[0]
    assert launch.returncode != 0  # torchrun reports the failed rank
    store = RunStore(str(db))
    deadline = time.monotonic() + 15
    while store.mark_lost_runs() == [] and time.monotonic() < deadline:
        if {run.status for run in store.list_runs()} - {"running"} == {"lost"}:
            break
        time.sleep(0.5)
    runs = {run.rank["rank"]: run for run in store.list_runs()}
    assert set(runs) == {0, 1}, (store.list_runs(), output[-3000:])
    assert runs[1].status == "lost", output[-3000:]
    assert runs[0].status in ("stopped", "error"), output[-3000:]  # ended by torchrun
    assert len(store.batches(runs[1].id)) >= 900  # its records up to its last flush
    assert len(store.batches(runs[0].id)) >= 900
    latest = store.rank_reports(runs[0].id)
    ended = max(at for at, _ in latest)
    states = {s.summary.rank: s for s in job_view(latest, ended, collecting=False).ranks}
    assert states[1].state == "lost" and states[0].state in ("stopped", "failed")


@pytest.mark.slow
def test_a_rank_whose_loader_hangs_is_named_and_the_job_stops_cleanly(tmp_path):
    """Rank 1's dataset hangs at its 200th batch: rank 1 sits in next(), rank 0 in its
    all-reduce. Rank 0's history names rank 1 as stuck in its loader; stopping the job
    (SIGTERM to torchrun, as Ctrl-C or a scheduler would) ends both runs "stopped"."""
    port = free_port()
    db = tmp_path / "node0" / "runs.sqlite"
    launch = _torchrun(tmp_path, "node0", [
        "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}"], [db, -1, -1, 100_000, 1])
    view = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and launch.poll() is None:
            time.sleep(1.0)
            store = RunStore(str(db)) if db.exists() else None
            runs = store.list_runs() if store else []
            gatherer = next((run for run in runs if run.rank["rank"] == 0), None)
            latest = store.rank_reports(gatherer.id) if gatherer else []
            view = job_view(latest, time.time(), collecting=True, stalled_s=3.0)
            if view.straggler:
                break
        assert view is not None and view.straggler is not None, launch.poll()
        assert view.straggler[0] == 1 and "waiting" in view.straggler[1]
        assert f"at train.py:{HANG_LINE} in __getitem__" in view.straggler[1]  # once overdue
        states = {r.summary.rank: r.state for r in view.ranks}
        assert states == {0: "running", 1: "stalled"}
    finally:
        launch.send_signal(signal.SIGTERM)
        output = launch.communicate(timeout=120)[0]
    runs = {run.rank["rank"]: run for run in RunStore(str(db)).list_runs()}
    assert {r: run.status for r, run in runs.items()} == {0: "stopped", 1: "stopped"}, output
    assert runs[1].result.batches == 200
    # where: the hung rank's own run names its batch, its indices and the line it sleeps on
    late = {w.code: w for w in runs[1].result.warnings}["overdue_batch"]
    assert "batch 200 had waited" in late.message and "[800, 801, 802, 803]" in late.message
    assert f"train.py:{HANG_LINE} in __getitem__" in late.message, late.message
    assert "train: batch 200 has taken" in output


def test_two_loaders_of_one_name_report_under_keys_of_their_own(tmp_path, monkeypatch):
    """Every rank watches its loaders in the same order, so the n-th loader of a name has the
    same key on every rank; two both left unnamed ("loader") do not overwrite each other."""
    import torch
    from torch.utils.data import DataLoader

    from dataloader_tuner import watch

    for name, value in {"RANK": 1, "WORLD_SIZE": 2, "LOCAL_RANK": 1, "LOCAL_WORLD_SIZE": 2,
                        "GROUP_RANK": 0}.items():
        monkeypatch.setenv(name, str(value))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    db = str(tmp_path / "runs.sqlite")
    first, second = (watch(DataLoader(torch.arange(8.0), batch_size=4), db=db) for _ in range(2))
    try:
        assert first.job_key != second.job_key
        assert first.reporter.keys[1] != second.reporter.keys[1]
    finally:
        first.close()
        second.close()


SLURM_JOB = """
import os, sys, time
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from dataloader_tuner import watch

# as srun scripts do: the process group from Slurm's variables, the address from the job
rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
dist.init_process_group("gloo", rank=rank, world_size=world)
loader = watch(DataLoader(torch.arange(800.0).view(-1, 1), batch_size=4), name="train",
               db=sys.argv[1])
for batch in loader:
    dist.all_reduce(batch.sum())
    time.sleep(0.002)
loader.close()
dist.destroy_process_group()
"""


@pytest.mark.slow  # two processes with gloo on loopback, ~3 s
def test_two_slurm_tasks_without_torchrun_are_gathered_by_rank_0(tmp_path):
    """``srun -N 2 -n 2 python train.py`` as Slurm starts it (no Slurm here: two processes
    given the variables srun gives its tasks, one history each as two nodes would have): each
    knows its place, and rank 0 gathers both through the process group's own store."""
    script = tmp_path / "train.py"
    script.write_text(SLURM_JOB)
    port = free_port()
    base = {k: v for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                         "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE")}
    tasks = []
    for rank in (0, 1):
        env = dict(base, PYTHONPATH=ROOT, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), SLURM_JOB_ID="4242",
                   SLURM_STEP_ID="0", SLURM_PROCID=str(rank), SLURM_NTASKS="2",
                   SLURM_LOCALID="0", SLURM_NODEID=str(rank), SLURM_TASKS_PER_NODE="1(x2)")
        tasks.append(subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / f"node{rank}.sqlite")], cwd=tmp_path,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [task.communicate(timeout=180)[0] for task in tasks]
    finally:
        for task in tasks:
            if task.poll() is None:
                task.kill()
                task.wait()
    assert [task.returncode for task in tasks] == [0, 0], outputs
    node0, node1 = (RunStore(str(tmp_path / f"node{n}.sqlite")) for n in (0, 1))
    [run0], [run1] = node0.list_runs(), node1.list_runs()
    assert run0.rank == RankIdentity(0, 2, 0, 1, 0, "slurm-4242.0").to_dict()
    assert run1.rank == RankIdentity(1, 2, 0, 1, 1, "slurm-4242.0").to_dict()
    latest = node0.rank_reports(run0.id)
    assert [(s.rank, s.node, s.status, s.batches) for _, s in latest] == [
        (0, 0, "ok", 200), (1, 1, "ok", 200)], latest
    assert latest[1][1].pid == run1.pid
