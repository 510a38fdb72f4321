"""Before/after verification: measure the old and the new settings side by side.

Applying a recommendation should be proven, not predicted. The two settings are measured as
real profile runs interleaved A B A B (the machine's load drifts; interleaving spreads the
drift over both), and each side's figure is the median of its rounds.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
from dataclasses import dataclass
from typing import Any, Callable

from dataloader_tuner.run.runner import RunHandle, RunRequest, RunState
from dataloader_tuner.store import RunStore

ARMS = ("before", "after")


class Verification:
    """Runs ``rounds`` pairs of profile runs in a background thread. ``on_run`` is told about
    each run as it starts (the dashboard shows it live)."""

    def __init__(self, before: RunRequest, after: RunRequest, store: RunStore | None,
                 rounds: int = 2, on_run: Callable[[RunHandle], None] | None = None) -> None:
        self.requests = {
            "before": dataclasses.replace(before, kind="verify", label="before"),
            "after": dataclasses.replace(after, kind="verify", label="after"),
        }
        self.store = store
        self.rounds = rounds
        self.on_run = on_run
        self.runs: list[tuple[str, RunHandle]] = []
        self.state = "running"  # running | ok | stopped | error
        self.error: str | None = None
        self._result: VerificationResult | None = None  # final once the thread has ended
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Verification":
        self._thread.start()
        return self

    @property
    def total_runs(self) -> int:
        return 2 * self.rounds

    @property
    def current(self) -> RunHandle | None:
        return self.runs[-1][1] if self.runs else None

    def stop(self) -> None:
        self._stop.set()
        if self.current is not None:
            self.current.stop()

    def wait(self, timeout_s: float | None = None) -> str:
        self._thread.join(timeout_s)
        return self.state

    def _run(self) -> None:
        request_time = max(r.seconds for r in self.requests.values())
        for _ in range(self.rounds):
            for arm in ARMS:
                if self._stop.is_set():
                    self.state = "stopped"
                    return
                handle = RunHandle(self.requests[arm], self.store).start()
                self.runs.append((arm, handle))
                if self.on_run is not None:
                    self.on_run(handle)
                handle.wait(request_time + self.requests[arm].timeout_s + 30)
                if not handle.state.done:
                    handle.stop()
                if handle.state is RunState.FAILED:
                    self.state = "error"
                    self.error = f"The {arm} run failed: {handle.live.error}"
                    return
        self.state = "stopped" if self._stop.is_set() else "ok"

    def result(self) -> "VerificationResult":
        """Per arm: each round's samples/s and consumer idle, their medians, and the ratio.
        Computed once the verification has ended (the page asks on every redraw)."""
        if self._result is not None:
            return self._result
        final = not self._thread.is_alive() and self.state != "running"
        arms = {}
        for arm in ARMS:
            results = [h.live.profile_result(h.state.value) for a, h in self.runs
                       if a == arm and h.state is RunState.FINISHED]
            rates = [r.samples_per_s for r in results if r.samples_per_s]
            idles = [r.consumer_idle_frac for r in results if r.consumer_idle_frac is not None]
            arms[arm] = ArmResult(
                config=(results[-1].config if results and results[-1].config is not None
                        else dict(self.requests[arm].settings)),
                snippet=results[-1].snippet if results else None,
                samples_per_s_rounds=rates,
                samples_per_s=statistics.median(rates) if rates else None,
                consumer_idle_frac=statistics.median(idles) if idles else None,
                run_ids=[h.run_id for a, h in self.runs if a == arm])
        before, after = arms["before"].samples_per_s, arms["after"].samples_per_s
        result = VerificationResult(self.state, self.error, self.rounds, arms["before"],
                                    arms["after"], after / before if before and after else None)
        if final:
            self._result = result
        return result


@dataclass(frozen=True)
class ArmResult:
    """One side of a verification: its settings and what its rounds measured."""

    config: dict[str, Any]  # the loader settings the runs used (LoaderConfig.to_json_dict)
    snippet: str | None  # the DataLoader(...) line of those settings
    samples_per_s_rounds: list[float]
    samples_per_s: float | None  # the median round
    consumer_idle_frac: float | None  # the median round's share of time waiting for data
    run_ids: list[int | None]  # the runs in the history


@dataclass(frozen=True)
class VerificationResult:
    state: str  # running | ok | stopped | error
    error: str | None
    rounds: int
    before: ArmResult
    after: ArmResult
    speedup: float | None  # after's median samples/s over before's


CLAIM_TOLERANCE_PCT = 15.0


def check_claim(baseline: dict | None, measured_speedup: float | None) -> str | None:
    """What verification says about the tune's claimed speedup (``baseline`` from the tune
    document): agreed within its uncertainty (at least CLAIM_TOLERANCE_PCT), or not."""
    claimed = (baseline or {}).get("speedup")
    if measured_speedup is None:
        return None
    if claimed is None:
        return (f"The tune claimed no speedup ({(baseline or {}).get('speedup_note')}); "
                f"verification measured {measured_speedup:.2f}x.")
    allowed = max(CLAIM_TOLERANCE_PCT, (baseline or {}).get("speedup_pct") or 0.0)
    off = 100.0 * (measured_speedup / claimed - 1)
    verdict = (f"within the ±{allowed:.0f}% allowed" if abs(off) <= allowed else
               f"more than the ±{allowed:.0f}% the claim allowed: the machine's load may have "
               "changed between the tune and now, or the trials were unlucky")
    return (f"The tune claimed {claimed:.2f}x; verification measured {measured_speedup:.2f}x "
            f"({off:+.0f}%, {verdict}).")
