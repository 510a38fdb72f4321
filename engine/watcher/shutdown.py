"""How a watched job's runs end with the job: each registered run is ended at exit ("error" with
the exception the script died of, else "ok"), and on SIGTERM "stopped" (or "ok", its loop's
epochs all run out) before the signal takes its course (NOTE [ Ending watched runs on
SIGTERM ]). A watched loader registers itself and ends through ``closing``.

NOTE [ Ending watched runs on SIGTERM ]

    torchrun stops a job's other ranks with SIGTERM when one fails (as do schedulers preempting
    a job, and ``kill``). Python's default dies on the spot, without atexit, leaving runs to be
    marked lost later. Where the job has no SIGTERM handler of its own, the watched runs end
    "stopped" (written, and reported to the job), then the signal takes its default course. A
    job that sets its own handler later replaces this one. A run whose loop had finished every
    epoch it started ends "ok" instead, with its result: a launcher that ends a job once its
    loop is done ends it so (Slurm's SIGTERM then SIGKILL after KillWait, Kubernetes' after
    terminationGracePeriodSeconds, when the script goes on saving or uploading), and so does
    a job preempted between epochs, whose every epoch is whole. Mid-epoch, it is "stopped".

    Python runs a handler only when the main thread is back in the interpreter: a rank blocked
    in a C call (a collective waiting for a dead peer) would not die until torchrun's SIGKILL,
    30 s later. So the signal also wakes a thread (signal.set_wakeup_fd, where the job does not
    use it already) that, if the handler has not run within BACKSTOP_S, ends the runs itself
    and kills the process. A SIGTERM that comes while a run is being closed is honoured once
    that close is done; a forked DataLoader worker gets the default handler back.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Protocol

from dataloader_tuner.errors import RunError


class Closable(Protocol):
    def close(self, status: str = "ok", error: dict | None = None) -> Any: ...

    def ended_whole(self) -> bool: ...


_watched: list[Closable] = []  # ended at exit, in order


def register(run: Closable) -> None:
    """``run`` ends with the process: at exit, or on SIGTERM."""
    _watched.append(run)
    _end_runs_on_sigterm()


@contextmanager
def closing(run: Closable) -> Iterator[None]:
    """Around a run's own close: it is no longer ended at exit, and a SIGTERM that arrives
    meanwhile ends the others and the process once it is done."""
    global _closing, _sigterm_pending
    if run in _watched:
        _watched.remove(run)
    _closing += 1
    try:
        yield
    finally:
        _closing -= 1
        if _closing == 0 and _sigterm_pending:  # a SIGTERM came while this run ended
            _sigterm_pending = False
            try:
                _stop_all()
            finally:
                _die_of_sigterm()


def failed_with(failure: BaseException, what: str = "The training") -> dict:
    """A watched run's error: the job ended with ``failure``."""
    return RunError(f"{what} ended with {type(failure).__name__}: {failure}",
                    type="watched_job_failed").to_dict()


@atexit.register
def _end_all() -> None:
    """At exit, every watched run ends: "error" with the exception if the script died of one
    (Python keeps it in sys.last_value), else "ok"."""
    failure = getattr(sys, "last_value", None)
    error = None
    if failure is not None:
        error = failed_with(failure, "The training script")
    _end_all_as("error" if error else "ok", error)


_sigterm_owner: int | None = None  # the process whose SIGTERM handler ends its watched runs
_stopping = threading.Event()  # its watched runs are being ended for a SIGTERM
_closing = 0  # runs being ended right now (close() is running)
_sigterm_pending = False  # a SIGTERM arrived during a close(): honoured once it is done
BACKSTOP_S = 2.0  # the main thread's handler did not run by then: ended from a thread


def _end_runs_on_sigterm() -> None:
    """Where the job has no SIGTERM handler: ours, and its backstop thread (NOTE [ Ending
    watched runs on SIGTERM ])."""
    global _sigterm_owner
    if (_sigterm_owner == os.getpid() or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        return
    _sigterm_owner = os.getpid()
    _stopping.clear()
    signal.signal(signal.SIGTERM, _stop_watched_runs)
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except (ValueError, OSError):
        previous = None
    if previous is None or previous != -1:  # the job's own (asyncio, ...): left as it was
        if previous not in (None, -1):
            signal.set_wakeup_fd(previous)
        os.close(read_end)
        os.close(write_end)
        return
    threading.Thread(target=_backstop, args=(read_end,), name="dataloader-tuner-sigterm",
                     daemon=True).start()


def _stop_watched_runs(signum, frame) -> None:
    global _sigterm_pending
    if os.getpid() == _sigterm_owner and _closing:
        # Ending a run already (the job's own end, or an exception's at exit): that close
        # ends the others too and then dies of the signal (see close).
        _stopping.set()
        _sigterm_pending = True
        return
    try:
        if os.getpid() == _sigterm_owner and not _stopping.is_set():
            _stopping.set()
            _stop_all()
    finally:
        _die_of_sigterm()


def _end_all_as(status: str, error: dict | None = None) -> None:
    for watched in list(_watched):  # (a copy: each close takes itself off the list)
        watched.close(status, error)


def _stop_all() -> None:
    """SIGTERM: each run "stopped", or "ok" where every epoch its loop started ran out (see
    the NOTE)."""
    for watched in list(_watched):
        watched.close("ok" if watched.ended_whole() else "stopped")


def _die_of_sigterm() -> None:
    """As the signal's default would have: the process ends with it."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _backstop(read_end: int) -> None:
    """Reads the signal numbers Python's C handler writes; on SIGTERM, gives the main thread
    BACKSTOP_S to run its handler, else ends the runs here and kills the process."""
    while True:
        try:
            got = os.read(read_end, 64)
        except OSError:
            return
        if not got:
            return
        if signal.getsignal(signal.SIGTERM) is not _stop_watched_runs:
            return  # the job put a handler of its own: SIGTERM is its business now
        if signal.SIGTERM in got and not _stopping.wait(BACKSTOP_S):
            _stopping.set()
            try:
                _stop_all()
            finally:
                os.kill(os.getpid(), signal.SIGKILL)


def _default_sigterm_in_child() -> None:
    """A forked DataLoader worker terminated by its loader dies at once, as without the tool."""
    if _sigterm_owner is not None and signal.getsignal(signal.SIGTERM) is _stop_watched_runs:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)
        except (ValueError, OSError):  # forked from a thread Python does not count as main
            pass


os.register_at_fork(after_in_child=_default_sigterm_in_child)
