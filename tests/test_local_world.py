"""Node-level tuning: with --local-world-size N every trial runs N loaders at once (the rank
measured plus N-1 companion processes), so the pick is per rank under real contention."""

import json
import subprocess
import sys

import psutil
import pytest

from dataloader_tuner import RunStore
from dataloader_tuner.run.live import LiveRun

from .conftest import ROOT, dataset_path
from .test_watch import reap_orphans


def companions_alive() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "multiprocessing.spawn" in cmdline and "engine" not in cmdline:
            found.append(proc)
    return found


@pytest.mark.slow
def test_a_node_of_two_ranks_is_tuned_with_two_loaders_running_at_once(tmp_path):
    before = {p.pid for p in companions_alive()}
    tune = subprocess.run(
        [sys.executable, "-m", "dataloader_tuner", "tune", dataset_path("small_map.py"),
         "--local-world-size", "2", "--budget-s", "10", "--json",
         "--db", str(tmp_path / "runs.sqlite")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert tune.returncode == 0, tune.stderr[-3000:]
    doc = json.loads(tune.stdout)
    measured = [t for t in doc["trials"] if t["phase"] not in ("prewarm",)]
    assert measured and all(t["ranks_measured"] == 2 for t in measured)
    # The node's figure counts the companion's batches over the same window as well.
    assert all(t["node_samples_per_s"] > t["samples_per_s"] for t in measured)
    assert any("Measured with 2 loaders running at once" in r for r in doc["reasons"])
    assert {p.pid for p in companions_alive()} <= before  # every companion was stopped
    # Its settings run on each rank: the run's /dev/shm checks count both ranks' batches.
    store = RunStore(str(tmp_path / "runs.sqlite"))
    assert LiveRun.stored(store, store.list_runs()[0].id).ranks_on_node == 2


BROKEN_COMPANION = """
import json, sys
from dataloader_tuner.child.companions import Companions
from dataloader_tuner.errors import RunError
try:
    Companions(sys.argv[1], {}, None, 1)
except RunError as exc:
    print(json.dumps({"type": exc.type, "message": str(exc)}))
"""


@pytest.mark.slow
def test_a_companion_that_cannot_load_the_target_is_named_and_stopped():
    """In a process of its own, as in the engine's child (multiprocessing keeps a helper
    process for the life of a process that has spawned)."""
    run = subprocess.run([sys.executable, "-c", BROKEN_COMPANION, dataset_path("syntax_error.py")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    reap_orphans()  # multiprocessing's resource tracker outlives it by a moment
    assert run.returncode == 0, run.stderr[-2000:]
    failure = json.loads(run.stdout)
    assert failure["type"] == "companion_failed" and "SyntaxError" in failure["message"]
