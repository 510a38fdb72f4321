"""Ray Train, really: a local Ray running a TorchTrainer of 2 workers, each loader watched.
Ray ends its workers once the training function returns, with no exit handlers: the runs end
finished all the same (NOTE [ Runs ended without a word ], engine/run/settle.py), each with
every batch its loop took, and the job's view shows each rank's final figures."""

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from dataloader_tuner import RunStore
from dataloader_tuner.dashboard import job_board
from dataloader_tuner.run.settle import settle_dead_runs

from .conftest import ROOT
from .jobs import reap_orphans

pytest.importorskip("ray.train.torch")  # requirements-test.txt installs it: CI runs these

JOB = os.path.join(ROOT, "tests", "trainers", "ray_train_job.py")


def _ray_job(db_path: str, *args: str) -> list[dict]:
    """The job's loops as it printed them, once Ray's own processes have ended: its actors
    outlive the driver by a moment and, orphaned, are handed to this process (the suite's
    subreaper once an engine ran here), which reaps them as init would outside the suite."""
    before = {p.pid for p in psutil.Process().children()}
    done = subprocess.run([sys.executable, JOB, db_path, *args], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT, GLOO_SOCKET_IFNAME="lo",
                                   OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    reap_orphans(before, timeout=60)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _settled(store: RunStore, runs: int) -> list:
    """The job's runs once the history found their writers gone (5 s of silence)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        settle_dead_runs(store)
        found = store.list_runs()
        if len(found) == runs and all(run.status != "running" for run in found):
            return found
        time.sleep(0.5)
    raise AssertionError([(run.id, run.status) for run in store.list_runs()])


@pytest.mark.slow  # a local Ray starts in ~10 s; the job, then 5 s until its writers are gone
def test_a_ray_train_job_s_runs_end_finished_with_every_batch(db_path):
    loops = _ray_job(db_path, "0.01")
    store = RunStore(db_path)
    runs = {run.rank["rank"]: run for run in _settled(store, 2)}
    for loop in loops:
        run = runs[loop["rank"]]
        assert run.status == "ok" and run.pid == loop["pid"], run
        assert run.result.batches == loop["batches"] == 32 and run.result.epochs == 2
        assert {w["id"] for w in run.result.workers} == {0}  # inside its worker too
    (job,) = job_board.job_views(store, job_board.read_board(store))
    assert [(state.state, state.summary.batches) for state in job.view.ranks] == [
        ("finished", 32), ("finished", 32)]
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if any(part in " ".join(p.info["cmdline"] or []) for part in ("raylet", "gcs_server"))]
    assert left == []  # ray.shutdown() stopped the local Ray it started


@pytest.mark.slow
def test_a_ray_train_job_through_prepare_data_loader_is_watched_inside_its_workers(db_path):
    """Ray's guide has the loop call prepare_data_loader, which hands back Ray's own
    DataLoader subclass iterating the loader it was given, one batch ahead: that loader is
    watched inside Ray's object (attach.py), its workers' rows too (before, the loop's side
    only), and the runs end finished with every batch."""
    loops = _ray_job(db_path, "0.01", "--prepare")
    store = RunStore(db_path)
    runs = {run.rank["rank"]: run for run in _settled(store, 2)}
    for loop in loops:
        run = runs[loop["rank"]]
        assert run.status == "ok" and run.framework == "Ray Train", run
        assert run.result.batches == loop["batches"] == 32 and run.result.epochs == 2
        assert {w["id"] for w in run.result.workers} == {0}
