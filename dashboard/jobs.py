"""The server-wide job board: which run, tune or verification is going on.

One ``Jobs`` object lives for the whole Streamlit server (``st.cache_resource``), not per
browser tab: closing or reloading a tab does not stop a run, a reload re-attaches to it, and
two tabs see the same run. One loader job at a time: runs competing for the same cores would
spoil each other's measurements, so starting a job stops the one before.

No Streamlit in this module; tests drive it directly.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import threading
import time

from typing import Callable, TypeVar

from dataloader_tuner import (LoaderConfig, ProfileResult, RunRequest, RunStore, TuneResult,
                              recommended_settings)
from dataloader_tuner.ui import LiveRun, RunHandle, Inspection, Verification, inspect_target

R = TypeVar("R", ProfileResult, TuneResult)
INSPECT_CACHE_S = 30.0  # a module target (no file mtime to watch) is re-read after this
# While a run streams, the live view recomputes its figures every second. Over a whole
# 100k-batch run that would cost the server most of a core, so a running run is shown over its
# most recent batches; the final result covers every batch.
LIVE_WINDOW_BATCHES = 3000


def live_view(handle: RunHandle) -> LiveRun:
    """What the live view shows of a run: all of it when done, its recent batches while running."""
    return handle.live if handle.state.done else handle.live.recent(LIVE_WINDOW_BATCHES)


class Jobs:
    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.run: RunHandle | None = None  # the profile or verification run the live view shows
        self.tune: RunHandle | None = None
        self.tune_request: RunRequest | None = None
        self.verification: Verification | None = None
        self.applied: dict | None = None  # the settings last applied, with what they replaced
        self.started_any = False
        self.last_request: RunRequest | None = None  # what a new tab opens on
        self._lock = threading.Lock()
        self._inspections: dict[tuple[str, float | None], tuple[float, Inspection]] = {}
        self._profiles: dict[RunHandle, ProfileResult] = {}
        self._tunes: dict[RunHandle, TuneResult] = {}
        atexit.register(self.stop_all)

    def profile_result(self, handle: RunHandle) -> ProfileResult:
        """A profile or verification run's result (see _result)."""
        return self._result(handle, LiveRun.profile_result, self._profiles)

    def tune_result(self, handle: RunHandle) -> TuneResult:
        """A tune's result (see _result)."""
        return self._result(handle, LiveRun.tune_result, self._tunes)

    @staticmethod
    def _result(handle: RunHandle, made_by: Callable[[LiveRun, str], R],
                 done: dict[RunHandle, R]) -> R:
        """The run's result; computed once when the run is over (it is then final).
        While it runs, over its last ``LIVE_WINDOW_BATCHES`` batches only (see live_view)."""
        if not handle.state.done:
            return made_by(live_view(handle), handle.state.value)
        if handle not in done:  # keyed by the handle itself: ids get reused
            done[handle] = made_by(handle.live, handle.state.value)
        return done[handle]

    # -- jobs ------------------------------------------------------------------------------

    def busy(self) -> bool:
        jobs = [self.run, self.tune]
        return any(j is not None and not j.state.done for j in jobs) or (
            self.verification is not None and self.verification.state == "running")

    def start_run(self, request: RunRequest) -> RunHandle:
        with self._lock:
            self._stop_jobs()
            self._profiles.clear()
            self._tunes.clear()
            self.run = RunHandle(self._with_tuned_workers(request), self.store).start()
            self.last_request = request
            self.applied = None
            self.started_any = True
            return self.run

    def start_tune(self, request: RunRequest) -> RunHandle:
        with self._lock:
            self._stop_jobs()
            self.tune_request = self.last_request = request
            self.applied = None  # an earlier Apply belongs to an earlier recommendation
            self.tune = RunHandle(request, self.store).start()
            self.started_any = True
            return self.tune

    def apply(self, before: RunRequest, after: RunRequest, rounds: int = 2) -> Verification:
        """Start measuring the old settings against the new ones (see dataloader_tuner.run.verify)."""
        with self._lock:
            self._stop_jobs()
            self.applied = {"before": dict(before.settings), "after": dict(after.settings),
                            "target": after.target, "at": time.time()}
            self.last_request = after
            self.verification = Verification(before, self._with_tuned_workers(after), self.store,
                                              rounds,
                                              on_run=self._show_run).start()
            self.started_any = True
            return self.verification

    def _with_tuned_workers(self, request: RunRequest) -> RunRequest:
        """A run of the worker count the last tune of this target measured to pay says so, so
        its diagnostics do not contradict the recommendation."""
        tune = self.tune
        if tune is None or not tune.state.done or tune.request.target != request.target:
            return request
        recommended = (self.tune_result(tune).recommended or {}).get("num_workers")
        if recommended is None or request.settings.get("num_workers") != recommended:
            return request
        return dataclasses.replace(request, tuned_workers=recommended)

    def _show_run(self, handle: RunHandle) -> None:
        self.run = handle

    def stop_all(self) -> None:
        """Stop whatever runs. Bounded by RunHandle.stop (about 2 s per job)."""
        with self._lock:
            self._stop_jobs()

    def stop_in_background(self) -> threading.Thread:
        """For the page: the stop takes up to 2 s and the page must not wait for it."""
        thread = threading.Thread(target=self.stop_all, daemon=True)
        thread.start()
        return thread

    def _stop_jobs(self) -> None:
        if self.verification is not None and self.verification.state == "running":
            self.verification.stop()
        for job in (self.run, self.tune):
            if job is not None and not job.state.done:
                job.stop()

    # -- checking a target -----------------------------------------------------------------

    def inspect(self, target: str) -> Inspection:
        """What the target resolves to: its dataset card, or the error that stopped it.

        Resolved in a short-lived child process, never in the server: importing the user's
        module may crash, hang or print, and must not take the dashboard with it. Cached per
        file modification time.
        """
        key = (target, _mtime(target))
        cached = self._inspections.get(key)
        if cached and (key[1] is not None or time.monotonic() - cached[0] < INSPECT_CACHE_S):
            return cached[1]
        result = inspect_target(target)
        self._inspections[key] = (time.monotonic(), result)
        return result


def _mtime(target: str) -> float | None:
    path = target.split(":", 1)[0]
    try:
        return os.path.getmtime(path) if path.endswith(".py") else None
    except OSError:
        return None


def settings_from_controls(controls: dict) -> dict:
    """The loader settings on the page, as the settings a run is asked for. The module's other
    settings (shuffle, sampler, collate_fn, ...) are not on the page and stay the module's."""
    workers = int(controls["num_workers"])
    settings = {
        "num_workers": workers,
        "pin_memory": bool(controls["pin_memory"]),
        "prefetch_factor": int(controls["prefetch_factor"]) if workers else None,
        "persistent_workers": bool(controls["persistent_workers"]) if workers else False,
    }
    if workers and not controls.get("in_order", True):  # DataLoader's default otherwise
        settings["in_order"] = False
    if workers and controls.get("one_thread"):  # each worker's thread pools to one thread
        settings["worker_threads"] = 1
    if workers and controls.get("keep_freed"):  # KeepFreedMemory in each worker
        settings["keep_freed_memory"] = True
    if not controls.get("batch_sampler"):  # the module's batch sampler makes the batches
        settings["batch_size"] = (None if controls.get("self_batching")
                                  else int(controls["batch_size"]))
    LoaderConfig.from_settings(settings)  # refuse what DataLoader would, before starting
    return settings


def request_from_controls(target: str, controls: dict, kind: str = "profile") -> RunRequest:
    """A run request from the page's control values (see live_page.CONTROL_DEFAULTS)."""
    consumer = controls["consumer"]
    step_ms = {"train_step": None, "none": 0.0}.get(consumer, float(controls["step_ms"]))
    return RunRequest(target=target, settings=settings_from_controls(controls), step_ms=step_ms,
                      seconds=float(controls["seconds"]), timeout_s=float(controls["timeout_s"]),
                      kind=kind)


def tune_request(target: str, controls: dict) -> RunRequest:
    """Tune from the controls; the controls' own settings are the baseline it reports against."""
    request = request_from_controls(target, controls, kind="tune")
    budget = controls.get("budget_s")  # None: no limit, the tune runs its plan
    return dataclasses.replace(request, budget_s=float(budget) if budget is not None else None,
                               max_workers=int(controls["max_workers"]),
                               local_world_size=int(controls.get("local_world_size", 1)),
                               keep_order=bool(controls.get("keep_order", False)))



def controls_from_settings(settings: dict) -> dict:
    """The page's control values showing ``settings`` (the inverse of settings_from_controls)."""
    workers = int(settings.get("num_workers") or 0)
    batch_size = settings.get("batch_size", 1)
    return {
        "batch_sampler": settings.get("batch_sampler") is not None,
        "self_batching": batch_size is None,
        **({"batch_size": int(batch_size)} if isinstance(batch_size, int) else {}),
        "num_workers": workers,
        "pin_memory": bool(settings.get("pin_memory")),
        "prefetch_factor": int(settings.get("prefetch_factor") or 2),
        "persistent_workers": bool(settings.get("persistent_workers")) and workers > 0,
        "in_order": settings.get("in_order") is not False or workers == 0,
        "one_thread": settings.get("worker_threads") == 1 and workers > 0,
        "keep_freed": bool(settings.get("keep_freed_memory")) and workers > 0,
    }


def verification_requests(tuned: RunRequest, recommended: dict, seconds: float
                          ) -> tuple[RunRequest, RunRequest]:
    """(before, after): the settings the tune started from, and the recommended ones."""
    before = dataclasses.replace(tuned, kind="verify", seconds=seconds)
    return before, dataclasses.replace(
        before, settings=recommended_settings(tuned.settings, recommended))
