"""The Training jobs page's logic without Streamlit: which watched runs there are, their rates,
their torchrun jobs seen whole, and asking a job to tune. Tests drive it directly.

A redraw reads the runs once and the recent batches of every run it needs once
(``RunStore.recent_batches``), however many jobs are running, and the windows among them
once (NOTE [ Windows for fast loaders ]).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from dataloader_tuner import RunStore, StoredRun
from dataloader_tuner.ui import (BatchRecord, BatchWindow, JobView, RankSummary, job_view,
                                 latest_stretch, summary_from_batches, window_figures)

RUNS_SHOWN = 500
RATE_WINDOW_BATCHES = 500  # a running run's samples/s in the table: its latest batches
RANK_WINDOW_BATCHES = 2000  # each rank's figures: its most recent batches
MEMORY_TREND_S = 300.0  # a rank's memory trend: its reports of the last minutes

JobKey = tuple[str, "str | None"]  # (the torchrun job's id, the loader's name)


@dataclass(frozen=True)
class Board:
    runs: list[StoredRun]  # the watched runs, newest first
    rates: dict[int, float | None]  # samples/s by run id (see read_board)

    def shown_first(self) -> int | None:
        """The run the page opens on: the newest running job's first loader (its "train",
        whose batches keep coming, rather than a "val" watched after it that sits between
        epochs), else the newest run."""
        running = [run for run in self.runs if run.status == "running"]
        if not running:
            return self.runs[0].id if self.runs else None
        newest = running[0]
        same_job = [run for run in running if (run.pid, run.host) == (newest.pid, newest.host)]
        return min(same_job, key=lambda run: (run.started_at, run.id)).id

    def jobs(self) -> dict[JobKey, list[StoredRun]]:
        """Watched runs of torchrun jobs, by (job, loader)."""
        jobs: dict[JobKey, list[StoredRun]] = {}
        for run in self.runs:
            if run.rank:
                jobs.setdefault((run.rank["job_id"], run.label), []).append(run)
        return jobs


def read_board(store: RunStore, live_rates: bool = True) -> Board:
    """The watched runs and their samples/s: the result's, or while a run goes (its result
    comes at its end) the rate of its latest batches (not read without ``live_rates``)."""
    runs = store.list_runs(RUNS_SHOWN, kind="watch", results=False)
    if not live_rates:
        return Board(runs, {run.id: run.samples_per_s for run in runs})
    running = [run.id for run in runs if run.samples_per_s is None and run.status == "running"]
    recent = _recent(store, running, RATE_WINDOW_BATCHES)
    rates = {run.id: run.samples_per_s if run.id not in recent
             else window_figures(recent[run.id][0], windows=recent[run.id][1])["samples_per_s"]
             for run in runs}
    return Board(runs, rates)


def job_of(run: StoredRun) -> str:
    """Where a run's loader lives: its script, rank and process."""
    rank = run.rank
    where = (f"rank {rank['rank']}/{rank['world_size']}, node {rank['node_rank']}, "
             if rank else "")
    return f"{run.script or run.target} ({where}pid {run.pid} on {run.host})"


def run_label(run: StoredRun) -> str:
    when = time.strftime("%m-%d %H:%M:%S", time.localtime(run.started_at))
    return f"#{run.id} {run.label or 'loader'} [{run.status}] {when}: {job_of(run)}"


@dataclass(frozen=True)
class ShownJob:
    key: JobKey
    world_size: int
    view: JobView
    source: str  # where its figures come from, in a sentence


def job_views(store: RunStore, board: Board, now: float | None = None) -> list[ShownJob]:
    """Each torchrun job of the board seen whole: from rank 0's gathered reports (every node)
    or, without them, from its ranks' runs in this history (the ranks on this machine)."""
    now = time.time() if now is None else now
    shown: list[ShownJob] = []
    from_runs: dict[JobKey, list[StoredRun]] = {}
    for key, ranks in board.jobs().items():
        gathered = _gathered(store, ranks, now)
        if gathered is not None:
            shown.append(ShownJob(key, _place(ranks[0])["world_size"], *gathered))
        elif len(ranks) >= 2:
            from_runs[key] = ranks
    recent = _recent(store, [run.id for ranks in from_runs.values() for run in ranks],
                     RANK_WINDOW_BATCHES)
    for key, ranks in from_runs.items():
        latest = [(run.heartbeat_at or run.started_at, _own_summary(run, recent[run.id]))
                  for run in ranks]
        shown.append(ShownJob(
            key, _place(ranks[0])["world_size"],
            job_view(latest, now, any(run.status == "running" for run in ranks)),
            "From each rank's own run in this history (the ranks on this machine; rank 0 "
            "gathers every node's once the job's store is reachable)."))
    return shown


def _recent(store: RunStore, run_ids: list[int], last: int
            ) -> dict[int, tuple[list[BatchRecord], list[BatchWindow]]]:
    """Each run's ``last`` rows and the windows among them (their warm-up: the first row)."""
    rows = store.recent_batches(run_ids, last)
    windows = store.recent_windows({run_id: got[0].seq for run_id, got in rows.items() if got})
    return {run_id: latest_stretch(got, windows.get(run_id, [])) for run_id, got in rows.items()}


def _place(run: StoredRun) -> dict[str, Any]:
    """The run's place in its torchrun job (only such runs are grouped into jobs)."""
    return run.rank or {}


def _gathered(store: RunStore, ranks: list[StoredRun], now: float
              ) -> tuple[JobView, str] | None:
    """The job as its rank 0 gathered it through the job's own store, if it did."""
    for gatherer in ranks:
        if _place(gatherer)["rank"] != 0:
            continue
        latest = store.rank_reports(gatherer.id)
        if not latest:
            continue
        collecting = gatherer.status == "running"
        if not collecting:
            latest = _finals_from_runs(store, latest, ranks, gatherer)
        # Once rank 0 has stopped: the job as it last saw it (it gathers after its own end).
        seen_at = now if collecting else max(
            [gatherer.ended_at or gatherer.heartbeat_at or 0.0] + [at for at, _ in latest])
        series: dict[int, list[RankSummary]] = {}
        for _, report in store.rank_reports(gatherer.id, latest=False,
                                            since=seen_at - MEMORY_TREND_S):
            series.setdefault(report.rank, []).append(report)
        return (job_view(latest, seen_at, collecting, series),
                f"Gathered by rank 0 (run #{gatherer.id}) through the job's own "
                "torch.distributed store: every rank reports every 2 s, on every node.")
    return None


def _finals_from_runs(store: RunStore, latest: list[tuple[float, RankSummary]],
                      ranks: list[StoredRun], gatherer: StoredRun
                      ) -> list[tuple[float, RankSummary]]:
    """Rank 0's last view, a rank's report that was not its final one replaced by its own run
    in this history, where that run has ended (NOTE [ Runs ended without a word ]: Ray Train
    ends every rank at once, before their final reports reach rank 0); a rank none of whose
    reports reached rank 0 (a job shorter than the first report's 2 s) added from it so. Its
    run: the newest of that rank that ran beside ``gatherer`` (a job restarted under one id
    has older runs of each rank)."""
    ended: dict[int, StoredRun] = {}
    for run in ranks:  # (newest first)
        if (run.status != "running" and _ended_at(run) >= gatherer.started_at
                and _place(run)["world_size"] == _place(gatherer)["world_size"]):
            ended.setdefault(_place(run)["rank"], run)
    heard = {summary.rank for _, summary in latest}
    partial = [summary.rank for _, summary in latest
               if summary.status == "running" and summary.rank in ended]
    unheard = sorted(set(ended) - heard)
    if not partial and not unheard:
        return latest
    recent = _recent(store, [ended[rank].id for rank in partial + unheard], RANK_WINDOW_BATCHES)
    finals = {rank: _own_summary(ended[rank], recent[ended[rank].id])
              for rank in partial + unheard}
    # Each as of the end of rank 0's view: the view's end and the other ranks' states stay
    # (one it never heard, ended later than it, would move that end and call them lost).
    end = max(at for at, _ in latest)
    return ([(at, finals.get(summary.rank, summary)) for at, summary in latest]
            + [(end, finals[rank]) for rank in unheard])


def _ended_at(run: StoredRun) -> float:
    return run.ended_at or run.heartbeat_at or run.started_at


def _own_summary(run: StoredRun, recent: tuple[list[BatchRecord], list[BatchWindow]]
                 ) -> RankSummary:
    """A rank's summary from its own run in this history (its ``recent`` rows and windows)."""
    return summary_from_batches(
        run.label or "loader", _place(run), run.host or "", run.pid or 0, run.status,
        _ended_at(run) - run.started_at, *recent)


def request_tune(store: RunStore, run: StoredRun) -> list[int]:
    """Ask the job to tune in place; returns the runs asked. A torchrun job's loader is tuned by
    node, its ranks together (local rank 0 leads), so every running rank of the job in this
    history is asked."""
    asked = [run.id]
    if run.rank:
        asked = [other.id for other in store.list_runs(RUNS_SHOWN, kind="watch", results=False)
                 if other.rank and other.status == "running" and other.label == run.label
                 and other.rank["job_id"] == run.rank["job_id"]] or asked
    for run_id in asked:
        store.request_tune(run_id)
    return asked
