"""The parent side of a background run: start, stop, poll events, state.

The process protocol is described once, in NOTE [ Engine process protocol ] in protocol.py.
A reader thread drains the child's event pipe continuously (so the child never blocks on a full
pipe, and nothing depends on how often the UI polls), folds events into a ``LiveRun`` and writes
them to the run store as they arrive, so a killed server loses at most the last flush.
"""

from __future__ import annotations

import enum
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping
from typing import Callable

import psutil

from dataloader_tuner import protocol
from dataloader_tuner.access import TOKEN_ENV
from dataloader_tuner.errors import EngineError, RunError
from dataloader_tuner.run.live import LiveRun
from dataloader_tuner.protocol import RunRequest
from dataloader_tuner.record.folding import Thinner
from dataloader_tuner.record.windows import BatchWindow
from dataloader_tuner.store import RunStore, retention


STOP_GRACE_S = 1.2  # child's own clean stop; then its process group is killed


class RunState(enum.Enum):
    STARTING = "starting"  # child started, dataset not yet resolved
    RUNNING = "running"
    FINISHED = "ok"
    STOPPED = "stopped"
    FAILED = "error"

    @property
    def done(self) -> bool:
        return self in (RunState.FINISHED, RunState.STOPPED, RunState.FAILED)


def _become_subreaper() -> None:
    """Adopt orphaned grandchildren (workers of a killed child) so we can reap them.

    Linux only; elsewhere (or if refused) init adopts them as usual.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def child_environment(parent: Mapping[str, str], event_fd: int) -> dict[str, str]:
    """The engine child's environment: the dashboard's, less its token (the child runs the
    user's module, which may log its environment somewhere others read)."""
    env = dict(parent)
    env.pop("PYTHONUNBUFFERED", None)  # the child line-buffers instead (child.main)
    env.pop(TOKEN_ENV, None)
    env[protocol.EVENT_FD_ENV] = str(event_fd)
    return env


class EngineChild:
    """The engine's child process (``python -m dataloader_tuner.child``), as RunHandle drives it.

    RunHandle only needs this much of a child: its pid, ``poll``/``wait``, a polite stop, a
    forced kill of everything it started, and reaping the orphans a killed child leaves. Tests
    that need no real process give RunHandle another starter with the same methods (see
    ``child_starter``), e.g. one that replays a recorded event stream.
    """

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen
        self.pid = popen.pid

    @classmethod
    def start(cls, request: RunRequest, log) -> tuple["EngineChild", int]:
        """Start the child with ``request``; (the child, the read end of its event pipe)."""
        _become_subreaper()
        read_fd, write_fd = os.pipe()
        env = child_environment(os.environ, write_fd)
        try:
            popen = subprocess.Popen(
                [sys.executable, "-m", "dataloader_tuner.child"],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                env=env,
                start_new_session=True,  # its own process group: one killpg reaches its workers
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        stdin = popen.stdin
        assert stdin is not None  # started with stdin=PIPE
        stdin.write(json.dumps(request.to_json()).encode())
        stdin.close()
        return cls(popen), read_fd

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        """The exit code; subprocess.TimeoutExpired if it is still running after ``timeout``."""
        return self.popen.wait(timeout=timeout)

    def request_stop(self) -> None:
        """SIGTERM: the child stops its loader, reaps its workers and reports "stopped"."""
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def kill_group(self) -> None:
        """SIGKILL to the child's process group: the child and every worker it started."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def reap_orphans(self, worker_pids: set[int]) -> None:
        """Workers orphaned by a killed child were adopted by us (subreaper): reap them."""
        for pid in worker_pids:
            try:
                if psutil.Process(pid).ppid() == os.getpid():
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            except (psutil.Error, ProcessLookupError, ChildProcessError):
                pass


# What RunHandle starts when it is given no starter: the real child. A starter takes the
# request and the log file the child's output goes to, and returns (child, event pipe fd).
child_starter = EngineChild.start


class RunHandle:
    """A run of the user's loader in a child process. Thread-safe; never blocks the caller
    except in ``stop`` (bounded) and ``wait``."""

    def __init__(self, request: RunRequest, store: RunStore | None = None,
                 starter: Callable | None = None) -> None:
        self.request = request
        self.store = store
        self.starter = starter  # None: child_starter, read when the run starts
        self.live = LiveRun(request.target, request.tuned_workers,
                            mode="tune" if request.kind == "tune" else "profile")
        self._state = RunState.STARTING
        self._stop_requested = False
        self._proc: EngineChild | None = None
        self._reader: threading.Thread | None = None
        self._done = threading.Event()
        self._log = tempfile.TemporaryFile()
        self._log_read = 0  # how much of the log the reader thread has fed to live.output
        self.run_id: int | None = None
        self.started_at: float | None = None  # time.monotonic() at start
        self.listeners: list[Callable[[protocol.Event], None]] = []
        self._thinner = Thinner()  # the reader thread's: fast batches into windows

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> "RunHandle":
        if self._proc is not None:
            raise RuntimeError("run already started")
        self.started_at = time.monotonic()
        if self.store is not None:
            self.run_id = self.store.create_run(kind=self.request.kind, target=self.request.target,
                                                config=self.request.settings,
                                                label=self.request.label)
        self._proc, read_fd = (self.starter or child_starter)(self.request, self._log)
        self._reader = threading.Thread(target=self._read_events, args=(read_fd,), daemon=True)
        self._reader.start()
        return self

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def state(self) -> RunState:
        return self._state

    def stop(self, timeout_s: float = 2.0) -> RunState:
        """Stop the run; returns within ``timeout_s`` with the child and its workers gone."""
        deadline = time.monotonic() + timeout_s
        proc = self._proc
        if proc is None or self._done.is_set():
            return self._state
        self._stop_requested = True
        proc.request_stop()
        try:
            proc.wait(timeout=min(STOP_GRACE_S, max(deadline - time.monotonic(), 0.1)))
        except subprocess.TimeoutExpired:
            self._kill_group()
        self._done.wait(max(deadline - time.monotonic(), 0.1))
        return self._state

    def wait(self, timeout_s: float | None = None) -> RunState:
        self._done.wait(timeout_s)
        return self._state

    def close(self) -> None:
        """Stop if running and release the log file."""
        self.stop()
        self._log.close()

    def __enter__(self) -> "RunHandle":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- events ---------------------------------------------------------------------------

    def output_tail(self, max_bytes: int = 4000) -> str:
        """The end of what the child printed (the user's prints, tracebacks, torch's text)."""
        try:
            self._log.seek(0, os.SEEK_END)
            size = self._log.tell()
            self._log.seek(max(size - max_bytes, 0))
            return self._log.read().decode(errors="replace")
        except (OSError, ValueError):
            return ""

    # -- the reader thread -----------------------------------------------------------------

    def _read_events(self, fd: int) -> None:
        # the history's limits kept beside the reader: a prune here would fill the child's pipe
        pruner = threading.Thread(target=retention.keep_within_or_say, daemon=True,
                                  args=(self.store.path,)) if self.store is not None else None
        if pruner is not None:
            pruner.start()
        try:
            self._pump(fd)
        except Exception as exc:  # noqa: BLE001 - a bug here must still end the run cleanly
            self.live.error = RunError(
                f"Internal error while reading the run's events: {type(exc).__name__}: {exc}",
                details="".join(traceback.format_exception(exc)),
                type="engine_internal",
            )
            self._kill_group()
        finally:
            os.close(fd)
            if pruner is not None:
                pruner.join()
            self._finish()

    def _pump(self, fd: int) -> None:
        buffer = b""
        while True:
            ready, _, _ = select.select([fd], [], [], 0.5)
            self._read_log()
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                buffer = self._dispatch(buffer + chunk)
            elif self._child.poll() is not None:
                # The child is gone; orphaned workers may still hold the pipe open, so do
                # not wait for EOF: take what is there and finish.
                break
        self._dispatch(buffer + _read_available(fd))
        self._read_log()

    def _read_log(self) -> None:
        """Feed what the child and its workers printed since the last read to live.output.
        ``os.pread``: the file position belongs to output_tail."""
        try:
            while chunk := os.pread(self._log.fileno(), 1 << 16, self._log_read):
                self._log_read += len(chunk)
                self.live.output.feed(chunk)
        except (OSError, ValueError):  # closed under us: the run is being torn down
            pass

    def _dispatch(self, data: bytes) -> bytes:
        *lines, rest = data.split(b"\n")
        for line in lines:
            if line.strip():
                self._apply(protocol.decode(line))
        return rest

    def _apply(self, event: protocol.Event) -> None:
        """One event from the child; its batches' rows through the thinner first (NOTE
        [ Windows for fast loaders ])."""
        if isinstance(event, protocol.Ready):
            self._thinner.loose_below = event.warmup_batches
        if isinstance(event, protocol.Batches):
            # The child sends a flush's late GPU timings after its rows: the rows wait in the
            # tail until the next event, so a flush that came late (its rows already older than
            # TAIL_S) is not folded before its timings are on them (NOTE [ Windows for fast
            # loaders ])
            self._thinned(*self._thinner.take())
            self._thinned(*self._thinner.arrived(event.rows, hold=True))
            return
        if isinstance(event, protocol.LateTimings):
            event = protocol.LateTimings(
                [g for g in event.gaps if not self._thinner.late(g[0], gpu_gap_ms=g[1])],
                [c for c in event.copies
                 if not self._thinner.late(c[0], h2d_ms=c[1], h2d_other_ms=c[2])])
            self._thinned(*self._thinner.take())
            if not event.gaps and not event.copies:
                return
        if isinstance(event, protocol.Finished):
            self._thinned(*self._thinner.flush())
        elif isinstance(event, protocol.Resources) and self._thinner.tail:
            self._thinned(*self._thinner.take(event.t))  # a run between batches: by the clock
        self._deliver(event)

    def _thinned(self, rows: list, windows: list[BatchWindow]) -> None:
        # the windows first: a page reading meanwhile sees no kept row outside its window
        if windows:
            self._deliver(protocol.Windows([w.to_row() for w in windows]))
        if rows:
            self._deliver(protocol.Batches(rows))

    def _deliver(self, event: protocol.Event) -> None:
        self.live.apply(event)
        if isinstance(event, protocol.Ready):
            self._state = RunState.RUNNING
        if self.store is not None and self.run_id is not None:
            self.store.record_event(self.run_id, event)
        for listener in self.listeners:
            listener(event)

    def _finish(self) -> None:
        self._thinned(*self._thinner.flush())  # a child that died sent no Finished
        proc = self._child
        try:
            returncode = proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self._kill_group()
            returncode = proc.wait()
        proc.reap_orphans(self.live.worker_pids())
        # No error event, yet no clean end: the child died (or its report of a failure was
        # cut short). A stop requested before the child's handler was installed is no error.
        if (self.live.error is None and self.live.finished_reason in (None, "error")
                and not self._stop_requested):
            self.live.error = _crash_error(returncode, self.output_tail())
        if self.live.error is not None:
            self._state = RunState.FAILED
        elif self._stop_requested or self.live.finished_reason == "stopped":
            self._state = RunState.STOPPED
        else:
            self._state = RunState.FINISHED
        if self.store is not None and self.run_id is not None:
            status = self._state.value
            self.store.finish_run(self.run_id, status, self.live.result(status),
                                  self.live.error.to_dict() if self.live.error else None)
        self._done.set()

    def _kill_group(self) -> None:
        self._child.kill_group()

    @property
    def _child(self) -> EngineChild:
        """The child process, once start() made it (the reader thread runs after that)."""
        if self._proc is None:
            raise RuntimeError("the run's child process has not been started")
        return self._proc


def _read_available(fd: int) -> bytes:
    chunks = []
    while select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _crash_error(returncode: int, output: str) -> EngineError:
    """The child died without saying why: name the signal and show what it printed."""
    if returncode < 0:
        name = signal.Signals(-returncode).name
        headline = f"The engine process was killed by {name}"
        if name == "SIGKILL":
            headline += " (often the kernel's out-of-memory killer)"
        elif name == "SIGSEGV":
            headline += " (a crash in native code, e.g. an extension the dataset uses)"
    else:
        headline = f"The engine process exited with code {returncode} without a result"
    return RunError(headline + ".", details=output, type="engine_crashed")


def run_to_completion(request: RunRequest, store: RunStore | None = None,
                      on_event: Callable[[protocol.Event], None] | None = None) -> RunHandle:
    """Start a run and wait for it; Ctrl-C stops it cleanly (workers reaped) and re-raises."""
    handle = RunHandle(request, store)
    if on_event is not None:
        handle.listeners.append(on_event)
    handle.start()
    try:
        if request.kind == "tune":  # a tune runs its plan; the child's watchdog ends a hang
            handle.wait(None if request.budget_s is None
                        else request.budget_s + 60 + request.timeout_s + 30)
        else:
            handle.wait(request.seconds + request.timeout_s + 30)
        if not handle.state.done:
            handle.stop()
    except KeyboardInterrupt:
        handle.stop()
        raise
    return handle
