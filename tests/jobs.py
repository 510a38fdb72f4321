"""Training jobs run by the tests as real processes: one that hangs fails its test with the
Python stack of every process in its tree (ranks, their DataLoader workers), read with py-spy
before the tree is killed, instead of pytest's timeout showing only the test's own wait."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sysconfig
import time

import psutil
import pytest

from dataloader_tuner.instrument.fork_stuck import WORKER_NAME

JOB_TIMEOUT_S = 200  # below pytest's 300 s (pyproject.toml), with the dumps and the kill
DUMPS_S = 40.0  # all the tree's stacks together


def run_job(command: list[str], timeout: float = JOB_TIMEOUT_S,
            **popen: object) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True)``; past ``timeout``, the
    stacks of the whole tree in the failure, the tree killed and reaped. The job runs in a
    session of its own: whatever it started is killed with it, also when the test is
    interrupted (pytest's own timeout, Ctrl-C)."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **popen) as job:  # type: ignore[call-overload]
        try:
            out, err = job.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            tree = _tree(job.pid)
            deadline = time.monotonic() + DUMPS_S
            stacks = "\n".join(stack_of(process, deadline) for process in tree)
            _kill_tree(job, tree)
            try:
                out, err = job.communicate(timeout=30)
            except subprocess.TimeoutExpired:  # a pipe held by something that escaped
                out, err = "", "(its output could not be read)"
            pytest.fail(f"{' '.join(command)} still running after {timeout:.0f} s. Stacks:\n"
                        f"{stacks}\nIts stderr (tail):\n{err[-3000:]}", pytrace=False)
        except BaseException:
            _kill_tree(job, _tree(job.pid))
            raise
    return subprocess.CompletedProcess(command, job.returncode, out, err)


def reap_orphans(before: set[int], timeout: float = 30) -> None:
    """Wait for the processes handed to this one (the suite's subreaper) since ``before``, the
    pids of its children then: what a job's processes leave to end on their own once the job
    has (a rank outliving its launcher; a rank's fork server and resource tracker, adopted only
    once that rank ends), which init would reap outside the suite. One still running after
    ``timeout`` fails the test."""
    deadline = time.monotonic() + timeout
    while True:
        adopted = [p for p in psutil.Process().children() if p.pid not in before]
        if not adopted:
            return
        gone, alive = psutil.wait_procs(adopted, timeout=max(deadline - time.monotonic(), 0))
        assert not alive, f"still running {timeout:.0f} s after the job: {alive}"
        before = before | {p.pid for p in gone}


def _kill_tree(job: subprocess.Popen, tree: list[psutil.Process]) -> None:
    try:
        os.killpg(job.pid, signal.SIGKILL)  # its session's group: what it started
    except OSError:
        pass
    for process in tree:  # and what left the group (a launcher's own session)
        _kill(process)
    psutil.wait_procs(tree, timeout=10)


def _tree(pid: int) -> list[psutil.Process]:
    """The job's process and all it started (none once it has gone)."""
    try:
        job = psutil.Process(pid)
        return [job, *job.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stack_of(process: psutil.Process, deadline: float) -> str:
    """The process's Python stacks (every thread), or where the kernel has it waiting (also
    once ``deadline`` has passed: the dumps of a big tree stay within DUMPS_S)."""
    try:
        name = process.name()
        title = f"--- {process.pid} {name} ({process.status()})"
    except psutil.Error:
        return f"--- {process.pid}: gone"
    # (next to this Python where its scripts folder is not on PATH: a pyenv's, a venv's)
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=sysconfig.get_path("scripts"))
    # A DataLoader worker's C frames too: a worker that hung once in CI showed only the
    # Python line it stopped at (linecache.lazycache), not the lock it waited for. Plain
    # where native unwinding fails for this build.
    tries = [["--native"], []] if name == WORKER_NAME else [[]]
    for options in tries if spy is not None else []:
        left = deadline - time.monotonic()
        if left <= 1:
            break
        try:
            dumped = subprocess.run([spy, "dump", *options, "--pid", str(process.pid)],
                                    capture_output=True, text=True, timeout=min(left, 20))
        except subprocess.TimeoutExpired:
            break
        if dumped.returncode == 0 or options is tries[-1]:
            return f"{title}\n{_compact(dumped.stdout) or dumped.stderr}"
    try:
        with open(f"/proc/{process.pid}/wchan") as wchan:
            return f"{title} waiting in {wchan.read()}"
    except OSError:
        return title


IDLE_TOPS = ("Condition.wait ", "Queue._feed ", "Listener.accept ")


def _compact(dump: str) -> str:
    """A py-spy dump with the threads that only wait for work (a Condition, a queue's feeder,
    a listener) folded into one line: CI shows a part of a failure, and a job's many idle
    threads pushed its workers' stacks out of it."""
    kept, idle = [], []
    for block in re.split(r"\n(?=Thread )", dump.strip()):
        head, _, frames = block.partition("\n")
        top = frames.strip().splitlines()[:1]
        if head.startswith("Thread ") and "MainThread" not in head and top and any(
                top[0].strip().startswith(name) for name in IDLE_TOPS):
            idle.append(head.split('"')[1] if '"' in head else head)
        else:
            kept.append(block)
    if idle:
        kept.append(f"({len(idle)} threads waiting for work: {', '.join(idle)})")
    return "\n".join(kept)


def _kill(process: psutil.Process) -> None:
    try:
        process.kill()
    except psutil.Error:
        pass
