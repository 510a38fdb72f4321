"""The engine's child process: runs the user's loader in its main thread and streams events.

The protocol (the request, every event, their order) is NOTE [ Engine process protocol ] in
protocol.py.

Why a separate process, started fresh (not forked from the server): the user's code may crash,
hang or leak, and must not take the dashboard with it; torch installs its dead-worker SIGCHLD
handler only from a main thread; and forking a multi-threaded server is unsafe.

Why the child kills its workers itself instead of ``del iterator``: DataLoader's own shutdown
joins each worker for up to 5 s, and a worker stuck in a slow ``__getitem__`` would blow the 2 s
stop promise. The child reaps them (pid 1 in a container may not), then leaves with
``os._exit`` so no atexit hook can block. If the child itself does not answer within the grace
period, the parent kills its whole process group (runner.py).

Parent death: a watchdog thread notices when the parent is gone and stops the run the same way.
"""

from __future__ import annotations

import gc
import io
import json
import os
import shutil
import signal
import sys
import threading
import time
import traceback
import warnings

import psutil

from dataloader_tuner.run.recorder import Recorder
from dataloader_tuner.run.sinks import PipeSink

from dataloader_tuner import system
from dataloader_tuner.child.starting import snippet_names, starting_config
from dataloader_tuner.child.dataset_card import dataset_card
from dataloader_tuner.errors import EngineError, RunError
from dataloader_tuner.child.failures import (explain_failure, hang_error, may_be_worker_death,
                                             worker_deaths_raise_once)
from dataloader_tuner.child.measure import Measurement
from dataloader_tuner.record.cards import Consumer
from dataloader_tuner.record.columns import BatchColumns
from dataloader_tuner.instrument import gpu, sampler, stalls
from dataloader_tuner.instrument.probes import counting_rules
from dataloader_tuner.child.target import resolve
from dataloader_tuner import protocol
from dataloader_tuner.protocol import RunRequest

WORKER_DEATH_GRACE_S = 1.0


class StopRun(BaseException):
    """Raised in the main thread by SIGTERM: a requested stop (BaseException so user code's
    ``except Exception`` cannot swallow it)."""


class Hang(BaseException):
    """Raised in the main thread by SIGUSR1 when no batch arrived within the timeout."""


class ChildRun:
    def __init__(self, request: RunRequest, events: PipeSink) -> None:
        self.request = request
        self.events = events
        self.t0 = time.monotonic()
        # Its thread runs the watchdog too (recorder.py says why one thread); it streams batch
        # rows and resource samples only in profile runs (a tune sends its trials).
        self.recorder = Recorder(events, self.t0)
        self.recorder.streaming = False
        self.stop_requested = False
        self.last_progress = time.monotonic()
        self.hang_info: dict | None = None
        self.interrupted = False  # a StopRun or a Hang raised in the main thread (_interrupt)
        # From the request, not os.getppid(): the parent may die before we get this far.
        self.parent_pid = request.parent_pid or os.getppid()
        self.measurement: Measurement | None = None
        self.stacks_dir: str | None = None  # made once a loader will run (_run)
        self.stalls: stalls.StallWatch | None = None  # once batches are measured (_run)

    # -- signals and watchdog -------------------------------------------------------------

    def _on_sigterm(self, signum, frame) -> None:
        if not self.stop_requested:
            self.stop_requested = True
            self._interrupt(StopRun())

    def _on_sigusr1(self, signum, frame) -> None:
        self._interrupt(Hang())

    def _interrupt(self, reason: BaseException) -> None:
        """Raise ``reason`` in the main thread, unless an earlier signal's is on its way out:
        a second raise there lands in whatever cleanup the first runs through. A Hang, then the
        parent's SIGTERM, in ``threading.Condition.wait``'s ``finally`` left its lock released
        and the run's report was "RuntimeError: release unlocked lock" (CI)."""
        if not self.interrupted:
            self.interrupted = True
            raise reason

    def _check_watchdog(self) -> bool:
        """Parent gone, or no batch within the timeout: interrupt the main thread. A batch
        overdue before that is reported and the run goes on (NOTE [ When a batch is overdue ],
        stalls.py)."""
        if os.getppid() != self.parent_pid:
            _signal_main_thread(signal.SIGTERM)
            return True
        now = time.monotonic()
        if self.recorder.pending():  # batches arrived since the last flush
            self.last_progress = now
        if self.recorder.streaming:  # (a tune's trials take this process's samples themselves)
            self._ship_own_samples()
        if self.stalls is not None and self.measurement is not None:
            self.stalls.observe(self.measurement.columns.batch_seconds(stalls.USUAL_SAMPLE))
            overdue = self.stalls.check(self.measurement.ledger, now, self._where_stuck)
            if overdue is not None:
                self.recorder.events.append(overdue)
        timeout_s = self.request.timeout_s or 0
        if timeout_s and now - self.last_progress > timeout_s:
            self.hang_info = {"timeout_s": timeout_s, "t": now - self.t0,
                              "outstanding": self._where_stuck()}
            _signal_main_thread(signal.SIGUSR1)
            return True
        return False

    def _ship_own_samples(self, final: bool = False) -> None:
        """This process's sampled stacks (its fetch at num_workers=0, receiving batches), to the
        parent as its workers' come (NOTE [ Sampling inside the workers ])."""
        own = sampler.running()
        sampled = own.take() if final and own is not None else sampler.due(time.monotonic())
        if sampled:
            self.recorder.events.append(protocol.Profiled(os.getpid(), -1, sampled))

    def _where_stuck(self) -> list[dict]:
        """Who holds the batches the loop waits for, with their stacks (best effort)."""
        measurement = self.measurement
        if measurement is None:
            return []
        try:
            return stalls.where_stuck(measurement.iterator, self.stacks_dir)
        except Exception:  # noqa: BLE001 - a detail of the report, never its failure
            return []

    def _warning_hook(self, message, category, filename, lineno, file=None, line=None) -> None:
        if self.request.kind == "tune" and "suggested max number of worker" in str(message):
            return  # the tuner tries such counts on purpose and judges them by measurement
        code = "torch_warning" if "torch" in filename else "python_warning"
        # The text a worker's warning has in the log (output.py), so the two count as one.
        self.events.send(protocol.WarningCaught(code, f"{category.__name__}: {message}",
                                                f"{filename}:{lineno}"))

    # -- the run ----------------------------------------------------------------------

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGUSR1, self._on_sigusr1)
        # Workers print their warnings to stderr (the log the parent reads, engine/run/output.py):
        # the hook writes to the event pipe under a lock a fork could copy while held.
        plain_showwarning = warnings.showwarning
        os.register_at_fork(after_in_child=lambda: setattr(warnings, "showwarning",
                                                           plain_showwarning))
        warnings.showwarning = self._warning_hook
        self.recorder.start(on_tick=self._check_watchdog)
        worker_deaths_raise_once()  # a second raise would escape the report of the first
        failure: BaseException | None = None
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - user code may raise anything
            failure = exc  # (no call here: a signal's handler runs at a call or a loop)
        try:  # first, before any slow work: torch's SIGCHLD handler raises for a worker's
            # death, and would abort the report of the first failure
            calm_signals()
        except BaseException as late:  # noqa: BLE001 - that handler, at calm_signals()'s call
            # Where torch's loader found the dead worker itself ("exited unexpectedly"), the
            # worker's SIGCHLD could still be pending: its "killed by signal" escaped the run
            # uncaught (exit 1, no report: once in CI, tests/broken/worker_bus_error.py). It
            # raises once (worker_deaths_raise_once), and names the signal where the loader's
            # own error could not. (Another handler pending may raise as _calmed begins.)
            try:
                failure = _calmed(failure, late)
            except BaseException as later:  # noqa: BLE001
                failure = _calmed(failure, later)
        reason, code = "stopped" if self.stop_requested else "deadline", 0
        try:
            if failure is not None and not isinstance(failure, StopRun):
                reason, code = "error", 1
                self._send_error(self._explain(failure))
        finally:
            if self.recorder.streaming:
                self._ship_own_samples(final=True)
            sampler.stop()
            self.recorder.stop(sample=False)
            reap_workers()
            if self.stacks_dir is not None:
                shutil.rmtree(self.stacks_dir, ignore_errors=True)
            self._send_labels()
            self.events.send(protocol.Finished(reason, time.monotonic() - self.t0))
        return code

    def _send_labels(self) -> None:
        """Class counts: from the dataset's own label list when it has one (exact, whatever
        the order), else from the batches the run sampled."""
        if self.measurement is None:
            return
        counts = self.measurement.dataset_labels
        if counts:
            self.events.send(protocol.Labels(counts, "dataset"))
        elif self.measurement.label_counts:
            self.events.send(protocol.Labels(self.measurement.label_counts, "batches"))

    def _explain(self, failure: BaseException) -> EngineError:
        if isinstance(failure, Hang):
            return self._hang_error()
        if isinstance(failure, EngineError):
            return failure
        signals = None
        if self.measurement is not None:
            # A worker dying mid-handover surfaces as a broken connection before the
            # worker's exit status is known: give it a moment to be reaped.
            grace_s = WORKER_DEATH_GRACE_S if may_be_worker_death(failure) else 0.0
            signals = self.measurement.worker_signals(grace_s)
        return explain_failure(failure, signals)

    def _run(self) -> None:
        request = self.request
        resolved = resolve(request.target)
        config = starting_config(resolved, request.settings)
        consumer = Consumer.choose(request.step_ms, resolved.train_step is not None)
        try:  # an iterable's first item only when inspecting: a run must not consume it
            dataset_info = dataset_card(resolved, with_sample=not resolved.is_iterable
                                    or request.kind == "inspect")
        except Exception as exc:  # noqa: BLE001
            raise RunError(
                f"Reading sample 0 failed: {type(exc).__name__}: {exc}",
                details=traceback.format_exc(),
                type="getitem_error",
            ) from exc
        ready = protocol.Ready(
            # verify runs measure as profile runs do
            mode=request.kind if request.kind in ("tune", "inspect") else "profile",
            pid=os.getpid(),
            dataset=dataset_info,
            config=config.to_json_dict(),
            snippet=config.snippet(expressions=snippet_names(resolved, config)),
            warmup_batches=config.warmup_batches,
            counting=counting_rules(config),
            consumer=consumer,
            system=system.snapshot(gpu.gpu_info()),
            torch=__import__("torch").__version__,
            # A node-level tune's settings run on each of its ranks: their batches share
            # /dev/shm (the check as the run starts, the run's diagnostics).
            ranks_on_node=request.local_world_size if request.kind == "tune" else 1,
        )
        self.events.send(ready)
        if request.kind == "inspect":  # the dashboard's check of a target: no loader
            return
        # Workers write their stacks here when a hang report asks (stacks.offer_stack).
        self.stacks_dir = stalls.new_stacks_folder()
        # The heap made so far (torch, the user's dataset) out of the collector's reach: NOTE
        # [ Measuring cost on the fastest batches ] (ledger.py). Forked workers' collections
        # then leave its pages unwritten too.
        gc.freeze()
        if request.sample_stacks:  # this process and its workers (instrument/sampler.py)
            os.environ[sampler.SAMPLE_ENV] = "1"
            sampler.start_if_asked()
        if request.kind == "tune":
            self._tune(resolved, config, consumer, ready.system)
            return
        self.recorder.streaming = True
        self.recorder.columns = columns = BatchColumns()
        self.last_progress = time.monotonic()
        # Kept on self: if the iterator were garbage-collected here, DataLoader's own shutdown
        # would join each worker for up to 5 s (see the NOTE above); reap_workers goes first.
        self.measurement = measurement = Measurement(
            resolved,
            config,
            consumer,
            seconds=float(request.seconds),
            # Written by the recorder's thread as they come; the watchdog sees progress as
            # batches waiting to be written.
            columns=columns,
            should_stop=lambda: self.stop_requested,
            on_epoch=self.recorder.epoch_began,
            on_worker=self.recorder.worker_seen,
            on_profile=self.recorder.profiled,
            labels=True,
        )
        self.t0 = self.recorder.t0 = time.monotonic()  # batch and sample times count from here
        self.stalls = stalls.StallWatch(self.t0)
        measurement.run()

    def _tune(self, resolved, config, consumer, system) -> None:
        from dataloader_tuner.child.tuning import run_tune

        def on_trial(trial) -> None:
            self.last_progress = time.monotonic()
            self.events.send(protocol.Measured(trial))

        def on_batches() -> None:  # a trial of slow batches is progress, not a hang
            self.last_progress = time.monotonic()

        document = run_tune(resolved, config, consumer, system, self.request, on_trial,
                            on_plan=lambda plan: self.events.send(protocol.Plan(plan)),
                            on_batches=on_batches)
        self.events.send(protocol.Tuned(document))

    def _hang_error(self) -> RunError:
        info = self.hang_info or {}
        return hang_error(info.get("timeout_s") or 0, info.get("outstanding") or [])

    def _send_error(self, error: EngineError) -> None:
        self.events.send(protocol.Error(error.to_dict()))


def _signal_main_thread(signum: int) -> None:
    """``signum`` to the main thread itself. Sent to the process, the kernel may hand it to
    another thread (this one, the watchdog's): Python's handler then waits for the main thread's
    next bytecode, and a main thread blocked in a lock's wait (a dataset's ``Event.wait()``)
    sleeps on. 1 hang in 12 was so reported only at the parent's SIGTERM, 40 s later."""
    main = threading.main_thread().ident
    if main is None:  # (not started: never so in a running child)
        os.kill(os.getpid(), signum)
    else:
        signal.pthread_kill(main, signum)


def calm_signals() -> None:
    """No more exceptions out of signal handlers: the run is over and being reported."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    # torch's SIGCHLD handler would raise "worker killed" for the deaths we are causing.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def _calmed(failure: BaseException | None, late: BaseException) -> BaseException:
    """calm_signals() done, whatever handler still raises meanwhile (a SIGTERM's or SIGUSR1's
    pending too); the run's report: ``failure`` (the run's own), unless ``late`` (raised as
    the signals were being calmed) names how a worker died where ``failure`` could not."""
    while True:
        if failure is None or (may_be_worker_death(failure)
                               and "killed by signal" in str(late)):
            late.__context__, failure = failure, late  # (the loader's traceback kept with it)
        try:
            calm_signals()
            return failure
        except BaseException as again:  # noqa: BLE001 - one more handler, pending till now
            late = again


def reap_workers(timeout_s: float = 1.0) -> None:
    """Kill and wait for every process this child started (its DataLoader workers)."""
    calm_signals()
    children = psutil.Process().children(recursive=True)
    for proc in children:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(children, timeout=timeout_s)


def main() -> None:
    # stdout belongs to the user's prints; events travel on their own descriptor. Line-buffered,
    # not unbuffered: unbuffered, print() writes its text and its newline separately, and two
    # forked workers printing at once interleave into one garbled line of the log (output.py
    # then counts it as a line of its own). A whole line is one write; workers inherit this.
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):  # as Python starts them (not replaced)
            stream.reconfigure(line_buffering=True)
    request = RunRequest.from_json(json.loads(sys.stdin.read()))
    if request.cwd:
        os.chdir(request.cwd)
    code = ChildRun(request, PipeSink(int(os.environ[protocol.EVENT_FD_ENV]))).run()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

