"""Where a stuck process is: each DataLoader worker offers its Python stack to a hang report
(written when signalled), and the main thread's is read directly. stalls.py asks; the probes
offer a worker's at its first fetch, and OfferingStack before the user's worker_init_fn."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable

import psutil
from torch.utils.data import get_worker_info

from dataloader_tuner.access import open_private

# A hang report names where a stuck worker is: each worker writes its Python stack to
# <STACKS_ENV folder>/<pid>.stack when sent STACK_SIGNAL (faulthandler: it dumps even from a
# worker blocked in C code, without the GIL).
STACKS_ENV = "DATALOADER_TUNER_STACKS"
STACK_SIGNAL = signal.SIGUSR2
_stack_file: Any = None


def offer_stack() -> None:
    """In a DataLoader worker, once: write this process's stack when asked (see STACKS_ENV).
    Nothing where no folder was given (a watched job's loader) or no signal can be had."""
    global _stack_file
    folder = os.environ.get(STACKS_ENV)
    if _stack_file is not None or not folder or get_worker_info() is None:
        return
    # Named once the signal is handled (its default action ends the process), after this
    # process and its start: a later worker given the same pid is never signalled for it.
    path = _stack_path(folder, os.getpid())
    if path is None:
        return
    try:
        _stack_file = open_private(path + ".new")  # it names the user's code and data
        faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True, chain=False)
        os.rename(path + ".new", path)
    except (OSError, ValueError, RuntimeError, AttributeError):  # no signals on this platform
        if _stack_file is not None:
            _stack_file.close()
        _stack_file = None


class OfferingStack:
    """A worker_init_fn that offers the worker's stack before the user's own runs (which it
    then calls): a worker stuck in its init, or in an iterable's start, can be named too."""

    def __init__(self, init_fn: Callable[[int], Any] | None) -> None:
        self.init_fn = init_fn

    def __call__(self, worker_id: int) -> None:
        offer_stack()
        if self.init_fn is not None:
            self.init_fn(worker_id)


def _stack_path(folder: str, pid: int) -> str | None:
    """<folder>/<pid>-<its start time>.stack, or None when no such process runs."""
    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        return None
    return os.path.join(folder, f"{pid}-{int(started * 100)}.stack")


def worker_stack(folder: str, pid: int, wait_s: float = 1.0) -> str | None:
    """The Python stack of worker ``pid`` (most recent call first), asked for by signal; None
    when it does not answer within ``wait_s`` (it never offered one, or it is gone). Only what
    this request added is read: an earlier dump stays in the file before it."""
    path = _stack_path(folder, pid)
    if path is None or not os.path.exists(path):
        return None
    before = os.path.getsize(path)
    try:
        os.kill(pid, STACK_SIGNAL)
    except OSError:
        return None
    deadline = time.monotonic() + wait_s
    seen = ""
    while time.monotonic() < deadline:
        time.sleep(0.05)
        with open(path) as f:
            f.seek(before)
            text = f.read()
        if text.strip() and text == seen:  # written and no longer growing
            # The thread the signal landed on first (the worker's main one, almost always)
            blocks = text.strip().split("\n\n")
            return "\n\n".join(sorted(blocks, key=lambda b: not b.startswith("Current")))
        seen = text
    return seen.strip() or None


def main_thread_stack() -> str | None:
    """The main thread's stack, most recent call first, as faulthandler writes a worker's."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    if frame is None:
        return None
    lines = [f'  File "{f.filename}", line {f.lineno} in {f.name}'
             for f in reversed(traceback.extract_stack(frame))]
    return "Main thread (most recent call first):\n" + "\n".join(lines)
