"""Training jobs run by the tests as real processes: one that hangs fails its test with the
Python stack of every process in its tree (ranks, their DataLoader workers), read with py-spy
before the tree is killed, instead of pytest's timeout showing only the test's own wait."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig

import psutil
import pytest

JOB_TIMEOUT_S = 240  # below pytest's 300 s (pyproject.toml): the dumps are this helper's


def run_job(command: list[str], timeout: float = JOB_TIMEOUT_S,
            **popen: object) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True)``; past ``timeout``, the
    stacks of the whole tree in the failure, the tree killed and reaped."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          **popen) as job:  # type: ignore[call-overload]
        try:
            out, err = job.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            tree = [psutil.Process(job.pid), *_descendants(job.pid)]
            stacks = "\n".join(stack_of(process) for process in tree)
            for process in tree:
                _kill(process)
            out, err = job.communicate()
            psutil.wait_procs(tree, timeout=10)
            pytest.fail(f"{' '.join(command)} still running after {timeout:.0f} s. Stacks:\n"
                        f"{stacks}\nIts stderr (tail):\n{err[-3000:]}", pytrace=False)
    return subprocess.CompletedProcess(command, job.returncode, out, err)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def stack_of(process: psutil.Process) -> str:
    """The process's Python stacks (every thread), or where the kernel has it waiting."""
    try:
        title = f"--- {process.pid} {process.name()} ({process.status()})"
    except psutil.Error:
        return f"--- {process.pid}: gone"
    # (next to this Python where its scripts folder is not on PATH: a pyenv's, a venv's)
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=sysconfig.get_path("scripts"))
    if spy is not None:
        try:
            dumped = subprocess.run([spy, "dump", "--pid", str(process.pid)],
                                    capture_output=True, text=True, timeout=30)
            return f"{title}\n{dumped.stdout or dumped.stderr}"
        except subprocess.TimeoutExpired:
            pass
    try:
        with open(f"/proc/{process.pid}/wchan") as wchan:
            return f"{title} waiting in {wchan.read()}"
    except OSError:
        return title


def _kill(process: psutil.Process) -> None:
    try:
        process.kill()
    except psutil.Error:
        pass
