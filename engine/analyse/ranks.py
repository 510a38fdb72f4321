"""A distributed job seen whole: each rank's loader, each node's load, and which rank holds the
others back.

Each rank of a watched torchrun job reports a ``RankSummary`` of its loader every few seconds
(watcher/job_report.py sends them through the job's own torch.distributed store; rank 0 writes
them to its history). From those: each rank's state (running, finished, silent, lost, stalled),
each node's CPU and /dev/shm use, and the straggler.

Every rank waits for the slowest at the next collective, so in a synchronised job every rank
runs at the same rate and the rate cannot name the straggler: its *input wait* does. The rank
whose loader starves waits in ``next()`` while the others wait for it inside their step (their
all-reduce), so its input wait stands out. Ranks that do not synchronise (no collectives each
step) show it in their rates as well.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, fields
from typing import Any, Iterable, Mapping, Sequence

from dataloader_tuner.analyse.pitfalls import SHM_FIXES
from dataloader_tuner.analyse.batch_log import window_figures
from dataloader_tuner.analyse.overdue import placed
from dataloader_tuner.record.rows import BatchRecord
from dataloader_tuner.record.windows import BatchWindow

SLOWER_THAN_MEDIAN = 0.05  # a rank this much below the median rate is named
STARVED_MARGIN = 0.10  # input wait this much above the others' median: the loader is the cause
SILENT_S = 10.0  # no report for this long while the job runs: the rank is hung hard or dead
# Ranks report every REPORT_S; rank 0 gathers for FINAL_WAIT_S more at its end (longer), so a
# rank still alive then was heard within REPORT_S of the end, and one silent longer was lost.
REPORT_S = 2.0
FINAL_WAIT_S = 3.0
STALLED_S = 30.0  # no batch for this long while the other ranks get theirs: the rank is stuck
SATURATED_CPU_PCT = 90.0  # a node this busy has no CPU left for its loaders' workers
SHM_FULL_SHARE = 0.8  # a node's /dev/shm this full is said while the job runs
GROWING_MB_PER_MIN = 50.0  # memory growth that is named (with at least MIN_GROWTH_MB in all)
MIN_GROWTH_MB = 200.0
# A rank's last word, and the state it puts the rank in ("lost": its run in a shared history
# was marked so, run/recorder.py).
FINAL = {"ok": "finished", "error": "failed", "stopped": "stopped", "lost": "lost"}


def report_key(loader: str, rank: int | str) -> str:
    """Where a rank's report (or a node's plan) lives in the job's torch.distributed store."""
    # A restarted job (torchrun --max-restarts) reports afresh: its attempt is in the key.
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"dataloader-tuner/{attempt}/{loader}/{rank}"


@dataclass(frozen=True)
class RankSummary:
    """One rank's loader as it reports itself to the job (~420 bytes of JSON): the figures are
    over its most recent batches; node_* as this rank saw its node."""

    loader: str  # the name given to watch()
    rank: int
    world_size: int
    local_rank: int
    node: int
    host: str
    pid: int
    seq: int  # counts this rank's reports: a rank whose count stops moving is silent
    status: str  # "running" or one of FINAL
    elapsed_s: float
    batches: int  # handed to the training loop so far
    last_batch_age_s: float | None  # since its loop last got a batch
    samples_per_s: float | None
    input_wait_frac: float | None  # share of its loop's time spent waiting in next()
    step_ms: float | None  # median step
    worker_busy_frac: float | None  # its loader's workers: share of their time making batches
    memory_mb: float | None  # main process + its loader's workers (PSS where readable)
    node_cpu_pct: float | None
    node_cpus: int | None
    shm_used_mb: float | None
    shm_total_mb: float | None
    # Seconds its loop has been inside next() right now (None: it is not): a rank stuck there
    # is held up by its loader, the others wait for it inside their step.
    waiting_for_batch_s: float | None = None
    # Where the batch it waits for is being made, once reported overdue (analyse/overdue.py)
    stuck_at: str | None = None
    # Where its loader's time goes (analyse/hotspots.py), where enough was sampled: the
    # seconds of work sampled, the stages' shares [[stage, share]] and the functions that
    # spent most of it themselves [[function, "file:line", self share, stage]]
    profile_s: float | None = None
    stages: list[list[Any]] | None = None
    top_functions: list[list[Any]] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> "RankSummary":
        data = json.loads(text)
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


PROFILE_STAGES, PROFILE_FUNCTIONS = 6, 3  # what a rank's report carries of its profile


def profile_fields(merged: dict[str, Any] | None) -> dict[str, Any]:
    """A rank's sampled profile (hotspots.py's merged stacks) as its report's fields: none where
    too few looks to show shares. Its functions by their own time (self), not their callees': a
    ``__getitem__`` holds every stack, the function it calls that spends the time says more."""
    if not merged or not merged.get("enough") or not merged.get("stages"):
        return {}
    own = sorted((h for h in merged["hotspots"] if h["self_share"] > 0),
                 key=lambda h: -h["self_share"])[:PROFILE_FUNCTIONS]
    return {"profile_s": merged["seconds"],
            "stages": [[s["stage"], s["share"]] for s in merged["stages"][:PROFILE_STAGES]],
            "top_functions": [[h["function"], f"{os.path.basename(h['file'])}:{h['line']}",
                               h["self_share"], h["stage"]] for h in own]}


def job_stages(summaries: Sequence[RankSummary]) -> list[tuple[str, float]]:
    """Every rank's stages merged: each share weighted by the seconds its rank sampled, so
    the job's shares are of all its loaders' work. Ranked, largest first."""
    seconds: dict[str, float] = {}
    for s in summaries:
        if not s.stages or not s.profile_s:
            continue
        for stage, share in s.stages:
            seconds[stage] = seconds.get(stage, 0.0) + share * s.profile_s
    total = sum(seconds.values())
    return sorted(((stage, t / total) for stage, t in seconds.items()),
                  key=lambda kv: -kv[1]) if total else []


def spends_most_in(rank: RankSummary) -> str | None:
    """"62% in _read_shard (read)": its loader's top function, where sampled."""
    if not rank.top_functions:
        return None
    function, where, share, stage = rank.top_functions[0]
    return f"{share:.0%} in {function} ({stage}, {where})"


@dataclass(frozen=True)
class RankState:
    summary: RankSummary
    state: str  # "running" | "finished" | "failed" | "stopped" | "silent" | "lost" | "stalled"
    note: str
    last_report_s: float  # seconds between its last report and ``now``


def rank_states(latest: Sequence[tuple[float, RankSummary]], now: float,
                collecting: bool, stalled_s: float = STALLED_S) -> list[RankState]:
    """Each rank's state from its last report and when it was received (``(received_at,
    summary)``). ``collecting``: the rank that gathers the reports is still doing so (else
    ``now`` is when it stopped, and a rank without a final report ended without one)."""
    ages = [s.last_batch_age_s for _, s in latest
            if s.status == "running" and s.last_batch_age_s is not None]
    states = []
    for received, s in sorted(latest, key=lambda item: item[1].rank):
        silent = max(0.0, now - received)
        if s.status == "lost":
            state, note = "lost", (f"its process ended without a goodbye (killed, or crashed "
                                   f"hard) at {s.batches} batches")
        elif s.status in FINAL:
            state, note = FINAL[s.status], f"{s.batches} batches"
        elif silent > SILENT_S and collecting:
            state, note = "silent", (f"no report for {silent:.0f} s: hung hard or dead (its last "
                                     f"report: {s.batches} batches)")
        elif not collecting and silent > REPORT_S + 0.5:
            # Rank 0 waits for every rank's final report before it stops gathering; each rank
            # sends one when its loader ends, on an exception and on torchrun's SIGTERM.
            state, note = "lost", (f"sent no final report: killed, crashed or its node went "
                                   f"down; last heard {silent:.0f} s before rank 0 stopped "
                                   f"gathering, at {s.batches} batches")
        elif not collecting:
            state, note = "running", (f"still running when rank 0 stopped gathering ({s.batches} "
                                      "batches then): no final report reached it")
        elif s.waiting_for_batch_s is not None and s.waiting_for_batch_s > stalled_s:
            state, note = "stalled", (f"waiting for a batch for {s.waiting_for_batch_s:.0f} s: "
                                      "its loader is stuck (a hung worker or file system, a "
                                      "deadlock in the dataset)"
                                      + (f", {placed(s.stuck_at)}" if s.stuck_at else ""))
        elif (s.last_batch_age_s is not None and s.last_batch_age_s > stalled_s
              and len(ages) > 1 and statistics.median(ages) < stalled_s / 3):
            state, note = "stalled", (f"no batch for {s.last_batch_age_s:.0f} s while the other "
                                      "ranks get theirs: stuck in its step")
        elif s.last_batch_age_s is not None and s.last_batch_age_s > stalled_s:
            state, note = "running", (f"in its step for {s.last_batch_age_s:.0f} s (waiting for "
                                      "another rank at a collective, or validating)")
        else:
            state, note = "running", f"{s.batches} batches"
        states.append(RankState(s, state, note, silent))
    return states


@dataclass(frozen=True)
class NodeLoad:
    node: int
    host: str
    ranks: tuple[int, ...]
    cpu_pct: float | None
    cpus: int | None
    shm_used_mb: float | None
    shm_total_mb: float | None
    memory_mb: float | None  # its ranks' loaders together

    @property
    def saturated(self) -> bool:
        return self.cpu_pct is not None and self.cpu_pct >= SATURATED_CPU_PCT

    def shm_warning(self) -> str | None:
        """Said while the job runs, once the node's /dev/shm is SHM_FULL_SHARE full: workers
        die with a bus error when a batch no longer fits."""
        used, total = self.shm_used_mb, self.shm_total_mb
        if used is None or not total or used < SHM_FULL_SHARE * total:
            return None
        return (f"Node {self.node} ({self.host}): /dev/shm is {used / total:.0%} full "
                f"({used:.0f} of {total:.0f} MB). Worker batches travel through it: when one "
                f"no longer fits, workers die with a bus error or 'No space left on device'. "
                f"{SHM_FIXES}")


def node_loads(summaries: Sequence[RankSummary]) -> list[NodeLoad]:
    """Per node, from its ranks' last reports: the median of their CPU readings, the most
    /dev/shm any of them saw in use."""
    nodes: dict[int, list[RankSummary]] = {}
    for s in summaries:
        nodes.setdefault(s.node, []).append(s)
    loads = []
    for node, members in sorted(nodes.items()):
        def known(values: Iterable[float | None]) -> list[float]:
            return [v for v in values if v is not None]
        cpu, shm = known(s.node_cpu_pct for s in members), known(s.shm_used_mb for s in members)
        memory = known(s.memory_mb for s in members)
        loads.append(NodeLoad(node, members[0].host, tuple(sorted(s.rank for s in members)),
                              statistics.median(cpu) if cpu else None,
                              members[0].node_cpus, max(shm) if shm else None,
                              members[0].shm_total_mb, sum(memory) if memory else None))
    return loads


def memory_growth(series: Sequence[RankSummary]) -> float | None:
    """MB per minute a rank's loader memory grew over its reports, when it clearly did (a
    steady climb of at least MIN_GROWTH_MB), else None."""
    points = [(s.elapsed_s, s.memory_mb) for s in series if s.memory_mb is not None]
    if len(points) < 8 or points[-1][0] - points[0][0] < 30:
        return None
    quarter = max(1, len(points) // 4)
    # The first and last quarters' medians: a spike is not a climb.
    early, late = points[:quarter], points[-quarter:]
    rise = statistics.median(m for _, m in late) - statistics.median(m for _, m in early)
    minutes = (statistics.median(t for t, _ in late) - statistics.median(t for t, _ in early)) / 60
    rate = rise / minutes
    return rate if rise >= MIN_GROWTH_MB and rate >= GROWING_MB_PER_MIN else None


def slowest_rank(summaries: Sequence[RankSummary],
                 series: Mapping[int, Sequence[RankSummary]] | None = None,
                 stalled_s: float = STALLED_S) -> tuple[int, str] | None:
    """(rank, why) when one rank holds the others back, else None. ``series``: each rank's
    reports over time, for the memory trend."""
    stuck = [s for s in summaries if s.status == "running"
             and (s.waiting_for_batch_s or 0) > stalled_s]
    if stuck:
        worst = max(stuck, key=lambda s: s.waiting_for_batch_s or 0)
        return worst.rank, (f"rank {worst.rank} has been waiting {worst.waiting_for_batch_s:.0f} "
                            "s for a batch: its loader is stuck"
                            + (f" {placed(worst.stuck_at)}" if worst.stuck_at else "")
                            + ", and the other ranks wait for it at their next collective.")
    rated = [s for s in summaries if s.samples_per_s]
    if len(rated) < 2:
        return None

    # Called only on ranks that reported the figure: ``or 0.0`` narrows the type, not the value.
    def rate(s: RankSummary) -> float:
        return s.samples_per_s or 0.0

    def wait(s: RankSummary) -> float:
        return s.input_wait_frac or 0.0

    median = statistics.median(rate(s) for s in rated)
    waiting = [s for s in rated if s.input_wait_frac is not None]
    # (a rank that outpaces the others holds no one back, whatever it waits: ranks in step at
    # their collectives share one pace; a short step's fetch is a larger part of it)
    keeping_pace = [s for s in waiting if rate(s) < (1 + SLOWER_THAN_MEDIAN) * median]
    if len(waiting) >= 2 and keeping_pace:
        starved = max(keeping_pace, key=wait)
        typical = statistics.median(wait(s) for s in waiting if s is not starved)
        if wait(starved) > typical + STARVED_MARGIN:
            return starved.rank, (
                f"rank {starved.rank} is starved for data: it waits for batches "
                f"{starved.input_wait_frac:.0%} of its time against {typical:.0%} on the other "
                f"ranks, which wait for it at each collective instead. "
                + _starved_because(starved, summaries, (series or {}).get(starved.rank, ()))
                + _spent_in(starved))
    slowest = min(rated, key=rate)
    if rate(slowest) > (1 - SLOWER_THAN_MEDIAN) * median:
        return None
    pace = f"{slowest.samples_per_s:.0f} samples/s against a median of {median:.0f}"
    steps = [s.step_ms for s in rated if s is not slowest and s.step_ms is not None]
    if slowest.step_ms is not None and steps:
        others = [wait(s) for s in waiting if s is not slowest]
        alike = (slowest in waiting and others
                 and abs(wait(slowest) - statistics.median(others)) <= STARVED_MARGIN)
        return slowest.rank, (f"rank {slowest.rank}'s steps are slower: {slowest.step_ms:.1f} ms "
                              f"against {statistics.median(steps):.1f} ms on the other ranks "
                              f"({pace})" + ("; its input wait is like theirs." if alike else "."))
    return slowest.rank, f"rank {slowest.rank} is the slowest ({pace})."


def _spent_in(rank: RankSummary) -> str:
    """Where its loader's time goes, where sampled: the function a user would open first."""
    where = spends_most_in(rank)
    return f" Its loader spends {where}." if where else ""


def _starved_because(rank: RankSummary, summaries: Sequence[RankSummary],
                     series: Sequence[RankSummary]) -> str:
    """Why its loader falls behind, where the numbers say."""
    loads = {load.node: load for load in node_loads(summaries)}
    mine = loads.get(rank.node)
    others = [load.cpu_pct for node, load in loads.items()
              if node != rank.node and load.cpu_pct is not None]
    # A saturated node has a CPU reading; ``is not None`` says so to the type checker.
    if (mine is not None and mine.cpu_pct is not None and mine.saturated
            and (not others or max(others) < mine.cpu_pct - 10)):
        return (f"Its node {rank.node} ({mine.host}) has no CPU to spare ({mine.cpu_pct:.0f}% "
                f"busy{' against ' + format(max(others), '.0f') + '% on the others' if others else ''}"
                "): fewer workers per rank there, or lighter decoding, would help.")
    growth = memory_growth(series)
    if growth is not None:
        return (f"Its loader's memory is growing ({growth:.0f} MB a minute): swapping or a "
                "leak in its dataset or collate can slow it down.")
    if rank.worker_busy_frac is not None and rank.worker_busy_frac > 0.9:
        return (f"Its workers are busy {rank.worker_busy_frac:.0%} of the time: more workers "
                f"on node {rank.node}, or cheaper samples, would feed it.")
    return f"Its loader (or node {rank.node}'s CPUs) is the bottleneck."


@dataclass(frozen=True)
class JobView:
    """A torchrun job's loader, whole: what the dashboard shows."""

    ranks: list[RankState]
    nodes: list[NodeLoad]
    straggler: tuple[int, str] | None  # (rank, why)
    stages: list[tuple[str, float]]  # where all ranks' loaders' time goes (job_stages)


def job_view(latest: Sequence[tuple[float, RankSummary]], now: float, collecting: bool,
             series: Mapping[int, Sequence[RankSummary]] | None = None,
             stalled_s: float = STALLED_S) -> JobView:
    """``latest``: each rank's last report with when it was received (rank_states). Once the
    gathering stopped, a rank still running then (no final report reached rank 0) is compared
    with no other: its report is of a moment before its end (Ray Train ends every rank at
    once: one rank's report at 32 of its 64 batches named it the straggler). A rank lost long
    before is, by its last report: how it ran until it died."""
    summaries = [s for _, s in latest]
    states = rank_states(latest, now, collecting, stalled_s)
    compared = [state.summary for state in states if collecting or state.state != "running"]
    return JobView(states, node_loads(summaries), slowest_rank(compared, series, stalled_s),
                   job_stages(summaries))


def summary_from_batches(loader: str, rank: dict[str, Any], host: str, pid: int, status: str,
                         elapsed_s: float, batches: Sequence[BatchRecord],
                         windows: Sequence[BatchWindow] = ()) -> RankSummary:
    """A rank's summary from its batches alone (no node figures): what a rank reports starts
    from it (job_report.py), and a job's ranks in a shared history without rank 0's gathered
    reports are shown from it."""
    batches = list(batches)
    last = batches[-1] if batches else None
    figures = {k: None if v is None else round(v, 4)
               for k, v in window_figures(batches, windows=windows).items()}
    return RankSummary(
        loader=loader, rank=rank["rank"], world_size=rank["world_size"],
        local_rank=rank["local_rank"], node=rank["node_rank"], host=host, pid=pid, seq=0,
        status=status, elapsed_s=elapsed_s,
        batches=max(last.seq if last else -1, windows[-1].last_seq if windows else -1) + 1,
        last_batch_age_s=None, samples_per_s=figures["samples_per_s"],
        input_wait_frac=figures["input_wait_frac"], step_ms=figures["step_ms"],
        worker_busy_frac=figures["worker_busy_frac"],
        memory_mb=None, node_cpu_pct=None, node_cpus=None, shm_used_mb=None, shm_total_mb=None)
