"""Background runs in a real child process with real workers."""

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest
import torch

from dataloader_tuner.run.runner import RunHandle, RunRequest, RunState, run_to_completion
from dataloader_tuner.store import RunStore

from .conftest import dataset_path


def _request(name, seconds=1.5, **settings):
    return RunRequest(target=dataset_path(name), settings=settings, seconds=seconds)


def test_run_with_workers_streams_and_summarises(db_path):
    store = RunStore(db_path)
    seen = []
    request = _request("small_map.py", batch_size=4, num_workers=2, persistent_workers=True)
    handle = run_to_completion(request, store,
                               on_event=lambda e: seen.append(e.kind))
    assert handle.state is RunState.FINISHED
    doc = handle.live.result("ok").to_dict()  # the JSON contract
    assert doc["samples_per_s"] > 0 and doc["batches"] > doc["warmup_batches"] == 4
    assert [w["id"] for w in doc["workers"]] == [0, 1]
    assert all(w["rss_mb"] > 0 and w["batches"] > 0 for w in doc["workers"]), doc["workers"]
    assert all(w["cpu_percent"] is not None and 0 < w["busy_frac"] <= 1 for w in doc["workers"])
    assert doc["main_process"]["rss_mb"] > 0
    if torch.cuda.is_available():  # copies timed even with no consumer (an H200: ~0.08 ms)
        assert doc["transfer"]["copy_ms"]["p50"] > 0 and doc["not_measured"] is None
    else:
        assert doc["transfer"] is None and "no CUDA GPU" in doc["not_measured"]
    assert doc["consumer_idle_frac"] is None  # no consumer
    assert doc["system"]["cpus_usable"] >= 1 and doc["system"]["shm"] is not None
    assert seen[0] == "ready" and seen[-1] == "finished" and "resources" in seen
    saved = store.get_run(handle.run_id)
    assert saved.status == "ok" and saved.result.batches == doc["batches"]
    assert len(store.batches(handle.run_id)) == doc["batches"]


@pytest.mark.slow  # ~3 s: waits for six resource samples
def test_events_are_streamed_at_least_every_half_second():
    times = []
    handle = RunHandle(_request("slow_items.py", seconds=30, num_workers=1)).start()
    try:
        handle.listeners.append(lambda e: times.append(time.monotonic()))
        deadline = time.monotonic() + 15
        while len(times) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        handle.stop()
    gaps = [b - a for a, b in zip(times[1:], times[2:])]
    assert len(times) >= 6 and max(gaps) < 0.75  # resource samples every 0.5 s


def test_stop_is_fast_and_reaps_workers_even_mid_sample():
    handle = RunHandle(_request("slow_items.py", seconds=60, num_workers=3)).start()
    deadline = time.monotonic() + 20
    while handle.state is not RunState.RUNNING and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # the workers are now inside a 10 s __getitem__
    workers = psutil.Process(handle.pid).children()
    assert len(workers) == 3
    started = time.monotonic()
    state = handle.stop()
    assert time.monotonic() - started < 2.2  # (its 2 s, and the last wait's 0.1 s floor)
    assert state is RunState.STOPPED
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in workers)
    assert not psutil.pid_exists(handle.pid) or psutil.Process(handle.pid).status() == "zombie"


def test_unresponsive_child_is_killed_with_its_group(monkeypatch):
    handle = RunHandle(_request("slow_items.py", seconds=60, num_workers=2)).start()
    deadline = time.monotonic() + 20
    while handle.state is not RunState.RUNNING and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    os.kill(handle.pid, signal.SIGSTOP)  # the child cannot answer SIGTERM now
    started = time.monotonic()
    handle.stop()
    assert time.monotonic() - started < 2.5
    assert handle.wait(3).done


def test_bad_target_fails_before_any_worker_starts():
    handle = run_to_completion(_request("syntax_error.py", num_workers=4))
    assert handle.state is RunState.FAILED
    assert handle.live.error.type == "target_syntax_error"
    assert handle.live.worker_pids() == set()
    assert handle.live.batches == []


@pytest.mark.slow  # 2.5 s: the quick loop has it through the CLI (test_diagnostics)
def test_exception_in_worker_names_worker_and_cause():
    handle = run_to_completion(_request("getitem_raises.py", num_workers=2, batch_size=2))
    error = handle.live.error
    assert handle.state is RunState.FAILED and error.type == "worker_error"
    assert "DataLoader worker process" in error.message and "KeyError" in error.message
    assert "label missing for sample 7" in error.details


def test_exception_without_workers():
    handle = run_to_completion(_request("getitem_raises.py", batch_size=2))
    assert handle.live.error.type == "dataset_error"
    assert "KeyError" in handle.live.error.message


def test_hard_crash_is_reported_with_the_signal():
    handle = run_to_completion(_request("hard_crash.py", batch_size=1))
    assert handle.state is RunState.FAILED
    assert handle.live.error.type == "engine_crashed"
    assert "SIGKILL" in handle.live.error.message


def test_hang_times_out_with_a_clear_message():
    request = RunRequest(target=dataset_path("slow_items.py"), settings={"num_workers": 1},
                         seconds=30, timeout_s=1.0)
    started = time.monotonic()
    handle = run_to_completion(request)
    assert time.monotonic() - started < 40  # (the child's torch import and its teardown
    # scale with a slow host; the 1 s timeout is what is checked, by the message below)
    assert handle.live.error.type == "hang"
    assert "No batch arrived within 1 s" in handle.live.error.message
    # where worker 0 sleeps, from its own stack (asked by signal), in the headline and details
    assert "stuck at slow_items.py:18 in __getitem__" in handle.live.error.message
    assert "Current thread" in handle.live.error.details
    # the child cleans up the folder its workers wrote their stacks to
    assert not glob.glob(os.path.join(tempfile.gettempdir(),
                                      f"dataloader-tuner-stacks-{handle.pid}-*"))


@pytest.mark.slow  # 5 s
def test_iterable_and_train_step_runs():
    stream = run_to_completion(_request("stream.py", seconds=1.0, num_workers=2, batch_size=5))
    assert stream.state is RunState.FINISHED and stream.live.result("ok").batches > 0
    stepped = run_to_completion(_request("with_step.py", seconds=1.5))
    doc = stepped.live.result("ok").to_dict()
    assert doc["consumer"]["kind"] == "train_step"
    assert 0.0 <= doc["consumer_idle_frac"] <= 1.0 and doc["input_bound"]


@pytest.mark.slow  # 2.5 s: the child's watchdog; the quick loop has the parent's (a child killed)
def test_parent_death_stops_the_child(tmp_path):
    """A killed dashboard must not leave the loader running: the child notices and exits."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {os.getcwd()!r})\n"
        "from dataloader_tuner.run.runner import RunHandle, RunRequest\n"
        f"h = RunHandle(RunRequest(target={dataset_path('slow_items.py')!r}, "
        "settings={'num_workers': 2}, seconds=60)).start()\n"
        "print(h.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = psutil.Popen([os.sys.executable, str(script)], stdout=-1, text=True)
    child_pid = int(parent.stdout.readline())
    time.sleep(2.0)
    child = psutil.Process(child_pid)
    workers = child.children()
    parent.kill()
    parent.wait()
    gone, alive = psutil.wait_procs([child] + workers, timeout=5)
    assert not alive


REENTRANT_FAILURE = r'''
import json, signal, subprocess, sys, time
from dataloader_tuner import protocol
from dataloader_tuner.child import process as child

def raise_like_torch(signum, frame):  # torch's SIGCHLD handler raises on each worker death
    raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Bus error.")

def failing_run(self):
    signal.signal(signal.SIGCHLD, raise_like_torch)
    subprocess.Popen(["sleep", "0.1"])  # a second death, while the first is being reported
    raise RuntimeError("DataLoader worker (pid 2) is killed by signal: Bus error.")

real_explain = child.explain_failure
def slow_explain(exc, signals):
    time.sleep(0.5)
    return real_explain(exc, signals)

events = []
class Writer:  # a sink (run/sinks.py) into a list
    where = "a list"

    def write(self, batch):
        events.extend(protocol.to_wire(event) for event in batch)

    def send(self, event):
        self.write([event])

child.ChildRun._run = failing_run
child.explain_failure = slow_explain
code = child.ChildRun(protocol.RunRequest("unused.py", timeout_s=0), Writer()).run()
print(json.dumps({"code": code, "events": events}))
'''


@pytest.mark.slow  # two workers dying in turn
def test_a_second_worker_death_does_not_cut_the_failure_report_short():
    out = subprocess.run([sys.executable, "-c", REENTRANT_FAILURE], capture_output=True,
                         text=True, timeout=30, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["code"] == 1
    kinds = [e["e"] for e in result["events"]]
    assert kinds[-2:] == ["error", "finished"], kinds
    assert "pid 2" in result["events"][-2]["error"]["message"]
