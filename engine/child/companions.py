"""The other ranks of a node, for tuning with ``--local-world-size N``.

A node's ranks each run their own DataLoader, and their workers compete for the same cores,
memory bandwidth and /dev/shm. Dividing the CPUs by N guesses at that; this measures it: N-1
companion processes, each a fresh interpreter that loads the target itself (as a rank would),
run the very loader a trial measures, at the same time. The measured loader's rate is then one
rank's under the real contention of N, and each companion's rate over the same window is
counted for the node's total.

Companions live for the whole tune (torch is imported once per companion) and take orders
over a pipe: run these settings, stop and hand back your batch times, exit. They are children
of the engine's child, in its process group: stopping a run stops them too.

One such interpreter also measures the end's claim in a second process (NOTE [ A claim from
two processes ], child/claiming.py): told a whole trial, it measures it alone, as the engine's
child would, and hands back the trial.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any, Callable

from dataloader_tuner.errors import RunError
from dataloader_tuner.record.columns import BatchColumns
from dataloader_tuner.record.trials import TrialResult
from dataloader_tuner.tune.trial_rules import HARD_CAP_S

if TYPE_CHECKING:  # the companion imports these (torch) itself, once started
    from dataloader_tuner.child import measure
    from dataloader_tuner.child.target import ResolvedTarget
    from dataloader_tuner.config import LoaderConfig, TunedSettings

START_TIMEOUT_S = 120.0  # a companion's first batch of a trial (its workers starting)
LOAD_TIMEOUT_S = 300.0  # a companion loading the target (importing torch and the module)
OTHER_RANKS = "A companion loader (another rank measured with --local-world-size)"

# What goes over a pipe: (kind, body), the body's type set by the kind ("run": TunedSettings,
# "rows": (time, samples) per batch, "trial": TrialOrder one way and TrialResult | None back,
# "error": the traceback, else None).
Message = tuple[str, Any]


@dataclass(frozen=True)
class CompanionRates:
    """Each companion's samples/s over the measured loader's steady window."""

    rates: tuple[float, ...]

    def node_total(self, own: float) -> float:
        return own + sum(self.rates)


@dataclass(frozen=True)
class TrialOrder:
    """A whole trial for a companion to measure alone (child/trial_run.py's measure_trial)."""

    tuned: TunedSettings
    phase: str
    repeat: int
    window: float | None = None
    limit_s: float | None = None  # a hard cut (the user's limit)
    share_s: float | None = None  # stop there once the rate has its batches (the aim's share)


# measure_trial's face for a TrialOrder: (target, its config, consumer, order) -> the trial
MeasureAlone = Callable[["ResolvedTarget", "LoaderConfig", "measure.Consumer", TrialOrder],
                        "TrialResult | None"]


class Companions:
    def __init__(self, target: str, settings: dict[str, Any], step_ms: float | None,
                 count: int, who: str = OTHER_RANKS,
                 beat: Callable[[], None] | None = None, alone: MeasureAlone | None = None
                 ) -> None:
        """``who``: what they are, as a failure names them; ``beat``: called about once a
        second while they load or measure a trial (the child's watchdog: waiting on them is
        progress while they live); ``alone``: how one measures a whole trial (``trial``), a
        module's function (it travels to the new interpreter by name)."""
        self.count, self.who, self.beat = count, who, beat
        context = multiprocessing.get_context("spawn")  # a fresh interpreter, as a rank's
        self.pipes: list[Connection[Message, Message]] = []
        self.processes: list[BaseProcess] = []
        for _ in range(count):
            mine, theirs = context.Pipe()
            process = context.Process(target=companion_main,
                                      args=(target, settings, step_ms, theirs, alone),
                                      name="dataloader-tuner-companion")
            process.start()
            theirs.close()
            self.pipes.append(mine)
            self.processes.append(process)
        try:
            for pipe in self.pipes:
                self._expect(pipe, "loaded", LOAD_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    def start(self, tuned: TunedSettings) -> None:
        """Every companion runs these settings over the target's own; returns once each has
        its first batch."""
        for pipe in self.pipes:
            pipe.send(("run", tuned))
        for pipe in self.pipes:
            self._expect(pipe, "started", START_TIMEOUT_S)

    def trial(self, order: TrialOrder) -> TrialResult | None:
        """The first companion measures a whole trial alone (the others idle) and hands it
        back; None where it reached no steady state."""
        pipe = self.pipes[0]
        pipe.send(("trial", order))
        limit = min(order.limit_s or HARD_CAP_S, HARD_CAP_S)
        result: TrialResult | None = self._expect(pipe, "trial", START_TIMEOUT_S + limit)
        return result

    def stop(self, window_start: float, window_end: float) -> CompanionRates:
        """Stop them all; each one's samples/s between two ``time.monotonic()`` instants (the
        clock is the machine's: the same in every process)."""
        for pipe in self.pipes:
            pipe.send(("stop", None))
        rates: list[float] = []
        seconds = max(window_end - window_start, 1e-9)
        for pipe in self.pipes:
            rows = self._expect(pipe, "rows", START_TIMEOUT_S)
            rates.append(sum(n for t, n in rows if window_start < t <= window_end) / seconds)
        return CompanionRates(tuple(rates))

    def close(self) -> None:
        """Each told to exit and its pipe closed (a companion still running a trial sees the
        end of its pipe), then joined; one that does not go is killed."""
        for pipe in self.pipes:
            try:
                pipe.send(("exit", None))
            except OSError:
                pass
            pipe.close()
        deadline = time.monotonic() + 10
        for process in self.processes:
            process.join(max(0.1, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(5)

    def _expect(self, pipe: Connection[Message, Message], kind: str, timeout_s: float) -> Any:
        if not self._answered(pipe, timeout_s):
            raise RunError(f"{self.who} did not answer within {timeout_s:g} s.",
                           type="companion_failed")
        try:
            got, body = pipe.recv()
        except EOFError:
            raise RunError(f"{self.who} died.", type="companion_failed") from None
        if got == "error":
            raise RunError(f"{self.who} failed: {body}", type="companion_failed")
        if got != kind:
            raise RunError(f"{self.who} answered {got!r} where {kind!r} was due.",
                           type="companion_failed")
        return body

    def _answered(self, pipe: Connection[Message, Message], timeout_s: float) -> bool:
        """Whether ``pipe`` has an answer within ``timeout_s``, beating each second meanwhile."""
        if self.beat is None:
            return pipe.poll(timeout_s)
        deadline = time.monotonic() + timeout_s
        while not pipe.poll(min(1.0, max(deadline - time.monotonic(), 0.0))):
            if time.monotonic() >= deadline:
                return False
            self.beat()
        return True


def companion_main(target: str, settings: dict[str, Any], step_ms: float | None,
                   pipe: Connection[Message, Message], alone: MeasureAlone | None = None
                   ) -> None:
    """One companion: load the target, then run settings as told until told to exit."""
    import traceback

    # Started by spawn, this process would start its DataLoader workers by spawn too (an
    # import of torch each, seconds per worker); a rank torchrun starts uses the platform's
    # default, as the measured loader in the engine's child does.
    multiprocessing.set_start_method(None, force=True)

    from dataloader_tuner.child.measure import Measurement
    from dataloader_tuner.record.cards import Consumer
    from dataloader_tuner.child.target import resolve
    from dataloader_tuner.child.starting import starting_config

    try:
        resolved = resolve(target)
        base = starting_config(resolved, settings)
        consumer = Consumer.choose(step_ms, resolved.train_step is not None)
        pipe.send(("loaded", None))
        while True:
            kind, body = pipe.recv()
            if kind == "trial" and alone is not None:  # body: a TrialOrder
                pipe.send(("trial", alone(resolved, body.tuned.applied_to(base), consumer,
                                          body)))
                continue
            if kind != "run":
                return
            rows = _run_until_stopped(resolved, body.applied_to(base), consumer, pipe,
                                      Measurement)
            if rows is None:  # told to exit mid-trial
                return
            pipe.send(("rows", rows))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return  # the tune ended
    except Exception as exc:  # noqa: BLE001 - told to the tune, which names it
        try:
            pipe.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        except OSError:
            pass


def _run_until_stopped(resolved: ResolvedTarget, config: LoaderConfig,
                       consumer: measure.Consumer, pipe: Connection[Message, Message],
                       Measurement: type[measure.Measurement]
                       ) -> list[tuple[float, int]] | None:
    columns = BatchColumns()
    started = [False]
    next_look = [0.0]

    def should_stop() -> bool:
        if not started[0] and measurement.ledger.seq:  # its first batch came
            started[0] = True
            pipe.send(("started", None))
        now = time.monotonic()
        if now < next_look[0]:
            return False
        next_look[0] = now + 0.01  # a pipe poll per batch would load tiny batches
        return pipe.poll()

    measurement = Measurement(resolved, config, consumer, 24 * 3600.0, columns, should_stop)
    try:
        measurement.run()
    finally:
        measurement.close()
    order, _ = pipe.recv()  # "stop", or "exit" if the tune is ending
    # (when each batch was handed over, its samples)
    return ([(measurement.t0 + row.t_ready, row.samples) for row in columns.rows()]
            if order == "stop" else None)
