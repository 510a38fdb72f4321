"""Chrome/Perfetto trace export of a run (pure) and from the CLI (a real saved run)."""

import json
import subprocess
import sys

import pytest

from dataloader_tuner.analyse.chrome_trace import chrome_trace

from .conftest import ROOT, dataset_path
from .records import make_batches


def test_trace_has_a_track_per_process_and_an_arrow_per_batch():
    batches = make_batches(10, workers=2)
    resources = [{"t": 0.5, "pid": 42, "role": "main", "worker_id": None, "cpu_percent": 50.0,
                  "rss_mb": 300.0}]
    doc = chrome_trace(batches, resources, label="run 7")
    events = doc["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {"main process (consumer) - run 7", "DataLoader worker 0 (pid 500)",
                     "DataLoader worker 1 (pid 501)"}
    fetches = [e for e in events if e["name"] == "fetch"]
    assert len(fetches) == 10 and {e["pid"] for e in fetches} == {500, 501}
    assert fetches[1]["dur"] == 15000.0  # microseconds
    waits = [e for e in events if e["name"] == "wait in next()"]
    assert {e["pid"] for e in waits} == {42}
    starts = [e for e in events if e["ph"] == "s"]
    ends = [e for e in events if e["ph"] == "f"]
    assert len(starts) == len(ends) == 10 and all(e["pid"] == 42 for e in ends)
    assert any(e["ph"] == "C" and e["name"] == "cpu %" for e in events)


def test_main_process_loading_stays_on_the_main_track():
    doc = chrome_trace(make_batches(3, workers=0), [], main_pid=400)
    fetches = [e for e in doc["traceEvents"] if e["name"] == "fetch"]
    assert {e["pid"] for e in fetches} == {400}
    assert not [e for e in doc["traceEvents"] if e["ph"] == "s"]


@pytest.mark.slow  # 3 s: a real profile first
def test_cli_exports_a_saved_run(db_path, tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "dataloader_tuner", "profile", dataset_path("small_map.py"),
         "--num-workers", "1", "--seconds", "1", "--json", "--db", db_path],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    run_id = json.loads(run.stdout)["run_id"]
    out = tmp_path / "trace.json"
    export = subprocess.run(
        [sys.executable, "-m", "dataloader_tuner", "trace", str(run_id), "--out", str(out), "--db", db_path],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert export.returncode == 0, export.stderr
    events = json.loads(out.read_text())["traceEvents"]
    assert any(e["name"] == "fetch" for e in events)
    missing = subprocess.run([sys.executable, "-m", "dataloader_tuner", "trace", "999", "--db", db_path],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no run 999" in missing.stderr
