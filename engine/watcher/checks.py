"""What a watched loader checks on each flush of its recorder, on the recorder's thread: a batch
overdue (written to the run and said on stderr; NOTE [ When a batch is overdue ], stalls.py),
and /dev/shm's free space against the batches the loader keeps in flight. A check that fails is
missed, never the recording or the job."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import time
from typing import Any, Callable

from dataloader_tuner import protocol
from dataloader_tuner.analyse import pitfalls
from dataloader_tuner.analyse.shm import tightest_shm
from dataloader_tuner.config import TunedSettings
from dataloader_tuner.analyse.overdue import overdue_now
from dataloader_tuner.instrument import sampler, stalls
from dataloader_tuner.record.taken import latest_bytes, seconds_of_taken
from dataloader_tuner.run.recorder import Recorder


def say(text: str) -> None:
    """A line for the job's stderr."""
    sys.stderr.write(f"[dataloader-tuner] {text}\n")
    sys.stderr.flush()


class PeriodicChecks:
    def __init__(self, name: str, recorder: Recorder, t0: float,
                 running: Callable[[], TunedSettings], iterator: Callable[[], Any],
                 ranks_on_node: int) -> None:
        """``running``: the setting the job's batches come from now; ``iterator``: the one the
        loop takes them from (who holds a late batch); ``ranks_on_node``: loaders sharing this
        machine's /dev/shm."""
        self.name, self.recorder = name, recorder
        self.running, self.iterator, self.ranks_on_node = running, iterator, ranks_on_node
        self.stalls = stalls.StallWatch(t0)
        self.stacks_dir = stacks_folder()
        self.shm_at_start: dict | None = None  # as the run's Ready read it (a rehearsed size?)
        # /dev/shm as the run goes: the sample last judged, the latest batch size seen, and
        # what was said (1: over half of it, 2: would not fit).
        self._shm_sample: protocol.Resources | None = None
        self._batch_bytes: int | None = None
        self._shm_said = 0

    def tick(self) -> bool:
        self.watch_stalls()
        self.watch_shm()
        self.ship_own_samples()
        return False  # never ends the recorder's thread

    def ship_own_samples(self) -> None:
        """The job's own process's sampled stacks, where it fetches itself (num_workers=0:
        instrument/sampler.py), written to the run as its workers' are."""
        sampled = sampler.due(time.monotonic())
        if sampled:
            self.recorder.events.append(protocol.Profiled(os.getpid(), -1, sampled))

    def watch_stalls(self) -> None:
        """Each flush: a batch overdue is written to the run and said on stderr."""
        try:
            self.stalls.observe(seconds_of_taken(self.recorder.taken, stalls.USUAL_SAMPLE))
            overdue = self.stalls.check(self.recorder.ledger, time.monotonic(),
                                        self.where_stuck)
            if overdue is not None:
                self.recorder.events.append(overdue)
                say(f"{self.name}: {overdue_now(overdue)} (its stack: the run's diagnostics)")
        except Exception:  # noqa: BLE001 - a report missed, never the recording (or the job)
            pass

    def watch_shm(self) -> None:
        """Each resource sample: /dev/shm's free space against the batches the loader keeps in
        flight now, said on stderr as it first crosses half and again once they would not fit
        (the run's diagnostics, read from the same samples, say it on the page)."""
        sample = self.recorder.last_resources
        if sample is None or sample is self._shm_sample:
            return
        self._shm_sample = sample
        try:
            self._batch_bytes = latest_bytes(self.recorder.taken) or self._batch_bytes
            current = self.running()
            found = pitfalls.shm_pressure(
                current.num_workers, current.prefetch_factor or 2, self._batch_bytes,
                tightest_shm(sample.procs, self.shm_at_start),  # this sample's reading
                self.ranks_on_node, in_use=True)
            level = 2 if found and found[0].evidence["will_not_fit"] else len(found)
            if level > self._shm_said:
                say(f"{self.name}: {found[0].message}")
            self._shm_said = max(self._shm_said, level)
        except Exception:  # noqa: BLE001 - a check missed, never the recording (or the job)
            pass

    def where_stuck(self) -> list[dict]:
        return stalls.where_stuck(self.iterator(), self.stacks_dir)


def stacks_folder() -> str | None:
    """Where this job's DataLoader workers write their stacks when a late batch asks
    (stacks.offer_stack): made once a process, removed at exit; an engine child's own folder
    where one is set already (not one a parent process named in the environment)."""
    folder = stalls.made_for_this_process()
    if folder is not None:
        return folder
    try:
        folder = stalls.new_stacks_folder()
    except OSError:
        return None  # late batches are named without their workers' stacks
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder
