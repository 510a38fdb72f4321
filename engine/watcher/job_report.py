"""Every rank's loader reported to one place, through the job's own torch.distributed store.

Under torchrun each watched rank writes a ``RankSummary`` of its loader (analyse/ranks.py, ~420
bytes of JSON) to the job's key-value store every REPORT_S, under a key of its own: a ``set``,
which waits on no other rank (no collective, no barrier). Rank 0 reads every rank's key
(``check`` first, so never a blocking ``get``) and writes the reports it has not seen into its
run history: the dashboard on rank 0's machine shows the whole job, every node.

The store is the job's own: torchrun's (its agent hosts it at MASTER_ADDR:MASTER_PORT when it
tells the ranks TORCHELASTIC_USE_AGENT_STORE=True) or, under another launcher, the default
process group's store once the job has made its process group. No port or service of ours.

All of it on a thread of its own: a slow or vanished store delays reports, never training.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import threading
import time
from dataclasses import replace
from datetime import timedelta
from typing import Callable

import psutil

from dataloader_tuner import system
from dataloader_tuner.analyse.overdue import where_held
from dataloader_tuner.instrument.stalls import StallWatch
from dataloader_tuner.record.taken import rows_of_taken
from dataloader_tuner.analyse.ranks import (FINAL, FINAL_WAIT_S, REPORT_S, RankSummary,
                                            profile_fields, report_key, summary_from_batches)
from dataloader_tuner.store import RunStore
from dataloader_tuner.watcher.rank_identity import RankIdentity
from dataloader_tuner.run.recorder import Recorder

STORE_TIMEOUT_S = 10.0  # for our own connection to torchrun's store
SERIES_EVERY_S = 30.0  # a rank's report is also kept in the history's series this often
COLLECTOR_RANK = 0
HOST = socket.gethostname()  # this process's node, as its reports name it
# A rank's profile is merged for its reports this often (and for its final one): each
# merge holds the GIL a few ms in the training process (~1.4 ms for 41 stacks here)
PROFILE_EVERY_S = 10.0


def throttled(read: Callable[[], dict | None], seconds: float) -> Callable[..., dict | None]:
    """``read()`` at most every ``seconds``, its last answer in between; ``fresh=True`` reads
    now."""
    last: list = [-math.inf, None]

    def call(fresh: bool = False) -> dict | None:
        now = time.monotonic()
        if fresh or now - last[0] >= seconds:
            last[0], last[1] = now, read()
        return last[1]

    return call


def job_store():
    """The job's key-value store, or None while there is none to use (a launcher other than
    torchrun, before the job has made its process group)."""
    from torch import distributed as dist

    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and addr and port:
        # torchrun's agent serves it for the whole job: a client connection, as the job's own
        # init_process_group makes.
        return dist.TCPStore(addr, int(port), is_master=False, wait_for_workers=False,
                             timeout=timedelta(seconds=STORE_TIMEOUT_S))
    if dist.is_available() and dist.is_initialized():
        return dist.distributed_c10d._get_default_store()
    return None


class RankReporter:
    """Reports this rank's loader every REPORT_S; on rank 0 also gathers every rank's reports
    into ``history`` (run ``run_id``)."""

    def __init__(self, identity: RankIdentity, loader: str, recorder: Recorder,
                 history: RunStore, run_id: int, connect=job_store,
                 stalls: StallWatch | None = None,
                 sampled: Callable[[], dict | None] = lambda: None) -> None:
        """``sampled()``: where the rank's loader's time went so far (run/sinks.py)."""
        self.identity, self.loader, self.recorder = identity, loader, recorder
        self.stalls = stalls  # the watcher's: where a batch reported overdue is being made
        self.sampled = throttled(sampled, PROFILE_EVERY_S)
        self.connect = connect
        self.keys = [report_key(loader, rank) for rank in range(identity.world_size)]
        self.gatherer = (JobGatherer(history, run_id, self.keys)
                         if identity.rank == COLLECTOR_RANK else None)
        self._store = None
        self._seq = 0
        self._failed = False
        self._finished = False
        self._cpu_times = psutil.cpu_times()  # the node's CPU, read as a difference
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dataloader-tuner-rank",
                                        daemon=True)

    def start(self) -> "RankReporter":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(REPORT_S):
            self.report("running")

    def report(self, status: str) -> None:
        """One round: this rank's report, and on rank 0 the gathering."""
        try:
            store = self._store = self._store or self.connect()
            if store is None:
                return
            self._seq += 1
            store.set(self.keys[self.identity.rank], self.summary(status).to_json())
            if self.gatherer is not None:
                self.gatherer.gather(store)
        except Exception as exc:  # noqa: BLE001 - reporting is never the job's problem
            self._store = None  # reconnect next round
            if not self._failed:
                self._failed = True
                sys.stderr.write(f"[dataloader-tuner] rank {self.identity.rank}: cannot report "
                                 f"to the job's store ({type(exc).__name__}: {exc}); its loader "
                                 "is still recorded in its own history\n")

    def gather(self, store) -> None:
        """Rank 0: every rank's newest report into the history (JobGatherer.gather)."""
        if self.gatherer is not None:
            self.gatherer.gather(store)

    def summary(self, status: str) -> RankSummary:
        recorder = self.recorder
        batches = rows_of_taken(recorder.t0, list(recorder.recent or ()))
        elapsed = time.monotonic() - recorder.t0
        last = batches[-1] if batches else None
        resources = recorder.last_resources
        memory = (sum(p["rss_mb"] for p in resources.procs if p.get("rss_mb") is not None)
                  if resources is not None else None)
        shm = system.shm_usage()
        asking = recorder.ledger.asking_since
        late = self.stalls.latest if self.stalls is not None else None
        waiting_on = (late.outstanding[0] if asking is not None and late is not None
                      and late.seq == recorder.ledger.seq and late.outstanding else {})
        return replace(
            summary_from_batches(self.loader, self.identity.to_dict(), HOST, os.getpid(),
                                 status, round(elapsed, 3), batches),
            seq=self._seq,
            last_batch_age_s=round(elapsed - (last.t_ready + last.step_s) if last else elapsed, 3),
            memory_mb=None if memory is None else round(memory, 1),
            node_cpu_pct=self._node_cpu_pct(), node_cpus=system.usable_cpus(),
            shm_used_mb=None if shm is None else round(shm["used_mb"], 1),
            shm_total_mb=None if shm is None else round(shm["total_mb"], 1),
            waiting_for_batch_s=None if asking is None else round(time.monotonic() - asking, 3),
            stuck_at=where_held(waiting_on),
            **profile_fields(self.sampled(fresh=status != "running")))

    def _node_cpu_pct(self) -> float | None:
        """The whole node's CPU busy since this reporter's last look (its own baseline: psutil's
        shared one is reset by every other caller in the process)."""
        now = psutil.cpu_times()
        before, self._cpu_times = self._cpu_times, now
        total = sum(now) - sum(before)
        idle = (now.idle + getattr(now, "iowait", 0.0)) - (before.idle
                                                            + getattr(before, "iowait", 0.0))
        return round(100.0 * (1 - idle / total), 1) if total > 0 else None

    def finish(self, status: str) -> None:
        """The final report; rank 0 gathers until every rank has sent its own (or
        FINAL_WAIT_S). Once: a SIGTERM arriving while rank 0 waits does not report again."""
        if self._finished:
            return
        self._finished = True
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(STORE_TIMEOUT_S)
        self.report(status)
        gatherer = self.gatherer
        if gatherer is None:
            return
        deadline = time.monotonic() + FINAL_WAIT_S
        while time.monotonic() < deadline and self._store is not None:
            if gatherer.all_final():
                break
            time.sleep(0.2)
            try:
                gatherer.gather(self._store)
            except Exception:  # noqa: BLE001
                break
        # Rank 0's last report, again: its time is when gathering ended (the page judges the
        # other ranks' silence against it, ranks.rank_states).
        self.report(status)


class JobGatherer:
    """Rank 0's share: each rank's newest report read from the store and written to the
    history (run ``run_id``), the series of them kept every SERIES_EVERY_S."""

    def __init__(self, history: RunStore, run_id: int, keys: list[str]) -> None:
        self.history, self.run_id, self.keys = history, run_id, keys
        self.seen: dict[int, int] = {}  # rank -> seq of its last report written to the history
        self.series_at: dict[int, float] = {}  # rank -> when its last report joined the series
        self.latest: dict[int, RankSummary] = {}

    def all_final(self) -> bool:
        """Every rank has sent its final report."""
        return (len(self.latest) == len(self.keys)
                and all(s.status in FINAL for s in self.latest.values()))

    def gather(self, store) -> None:
        received = time.time()
        fresh, series = [], []
        if len(self.latest) == len(self.keys) and hasattr(store, "multi_get"):
            # Every rank has reported once (its key stays): one round trip for all, where the
            # store has multi_get, not two per rank.
            texts = dict(enumerate(store.multi_get(self.keys)))
        else:
            texts = {rank: store.get(key) for rank, key in enumerate(self.keys)
                     if rank in self.latest or store.check([key])}  # else: still starting
        for rank, text in texts.items():
            summary = RankSummary.from_json(text)
            self.latest[rank] = summary
            if self.seen.get(rank) != summary.seq:
                self.seen[rank] = summary.seq
                fresh.append((received, summary))
                if (summary.status in FINAL
                        or received - self.series_at.get(rank, 0.0) >= SERIES_EVERY_S):
                    self.series_at[rank] = received
                    series.append((received, summary))
        if fresh:
            self.history.record_rank_reports(self.run_id, fresh, series)
