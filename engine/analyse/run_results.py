"""A run's result made from what it recorded (results.py has the types): ``profile_result``
and ``tune_result``, for LiveRun (run/live.py), which folds the run's events."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from dataloader_tuner.analyse import metrics, oversubscription, pitfalls
from dataloader_tuner.analyse.batch_log import BatchLog
from dataloader_tuner.analyse.memory_growth import worker_memory_growth
from dataloader_tuner.analyse.overdue import overdue_batches
from dataloader_tuner.analyse.ceiling import measured_cost
from dataloader_tuner.analyse.diagnostic import Diagnostic
from dataloader_tuner.analyse.fixes import ceiling_fields
from dataloader_tuner.analyse.shm import shm_check, tightest_shm
from dataloader_tuner.record.cards import Consumer, DatasetCard
from dataloader_tuner.analyse.hotspots import SampledProfile
from dataloader_tuner.record.rows import BatchRecord, TimedBatch, timed
from dataloader_tuner.record.trials import TrialRecord
from dataloader_tuner.record.windows import BatchWindow
from dataloader_tuner.analyse.results import ProfileResult, TuneResult
from dataloader_tuner.errors import EngineError, RunError
from dataloader_tuner.protocol import DEFAULT_MAX_WORKERS, Overdue
from dataloader_tuner.system import SystemSnapshot


class PrintedOutput(Protocol):
    def diagnostics(self) -> list[Diagnostic]: ...


class RunSoFar(Protocol):
    """What a run's events told so far, as the results are built from it: run.live.LiveRun
    folds them (declared here so that analysis never imports the runner)."""

    target: str
    tuned_workers: int | None
    warmup_batches: int
    batches: list[BatchRecord]
    windows: list[BatchWindow]  # where batches came fast (NOTE [ Windows for fast loaders ])
    resources: list[dict[str, Any]]
    epochs: list[dict[str, Any]]
    error: EngineError | None
    finished_reason: str | None
    elapsed_s: float
    trials: list[TrialRecord]
    tune_document: dict[str, Any] | None  # the child's tune result, as sent
    probes: list[dict[str, Any]]
    overdue: list[Overdue]
    stacks: SampledProfile  # every process's sampled stacks (instrument/sampler.py)

    # Read-only (properties): what the run's Ready event said, and the output it printed.
    @property
    def dataset(self) -> DatasetCard | None: ...
    @property
    def config(self) -> dict[str, Any] | None: ...
    @property
    def snippet(self) -> str | None: ...
    @property
    def consumer(self) -> Consumer | None: ...
    @property
    def system(self) -> SystemSnapshot | None: ...
    @property
    def torch_version(self) -> str | None: ...
    @property
    def counting(self) -> dict[str, Any] | None: ...
    @property
    def ranks_on_node(self) -> int: ...
    @property
    def label_counts(self) -> dict[Any, int]: ...  # protocol.Labels.counts
    @property
    def label_source(self) -> str: ...
    @property
    def output(self) -> PrintedOutput: ...


def profile_result(live: RunSoFar, status: str) -> ProfileResult:
    batches = list(live.batches)
    # where batches came fast, the rows are a sample and the windows count them all
    log = BatchLog(batches, live.windows)
    steady = log.steady_state(live.warmup_batches)
    measured = batches[live.warmup_batches:] if steady else batches
    measured_count = steady.batches if steady else log.batches
    skip = live.warmup_batches if steady else 0  # the warm-up, left out of the figures
    window = (steady.start, steady.end) if steady else (0.0, live.elapsed_s)
    idle = log.idle_fraction(steady)
    has_consumer = live.consumer is not None and live.consumer.steps
    # The child reports the GPU (gpu.gpu_info) in its first event; a run that failed before
    # that has no GPU figures either. (No torch here: the parent side stays light.)
    gpu_info: dict[str, Any] = live.system.gpu if live.system is not None else {
        "available": False, "reason": "the run ended before the GPU could be checked"}
    made = timed(measured)  # once: the costs, the counting and the CPU share read it
    per_batch = metrics.per_batch_costs(measured, made)
    wait = log.input_wait() if has_consumer else None
    warnings = tuple(live.output.diagnostics()
                     + _warnings(live, steady, made, per_batch, gpu_info))
    sampled = live.stacks.merged()
    workers = tuple(_workers(live, log, window))
    return ProfileResult(
        status=status,
        target=live.target,
        dataset=live.dataset,
        config=live.config,
        snippet=live.snippet,
        torch=live.torch_version,
        consumer=live.consumer,
        seconds=round(live.elapsed_s, 3),
        epochs=len(live.epochs),
        batches=log.batches,
        warmup_batches=live.warmup_batches,
        steady_batches=steady.batches if steady else 0,
        samples_per_s=steady.samples_per_s if steady else None,
        batches_per_s=steady.batches_per_s if steady else None,
        batch_latency_ms=log.latency_ms(skip),
        startup_s=live.epochs[0]["startup_s"] if live.epochs else None,
        per_batch=per_batch,
        counting=_counting(live.counting, measured, measured_count, len(made), log.windowed()),
        workers=workers,
        main_process=_main_process(live),
        consumer_idle_frac=idle if has_consumer else None,
        input_wait=wait.to_dict() if wait is not None else None,
        # On the headline figure, the wait the loop lived, start-ups included
        input_bound=metrics.input_bound_verdict(wait.share) if wait is not None else None,
        # (an even sample of the batches where rows are kept in windows)
        transfer=_transfer(log.even_rows()[skip:]) if gpu_info.get("available") else None,
        gpu_idle=_gpu_idle(log, skip) if gpu_info.get("available") else None,
        not_measured=None if gpu_info.get("available") else gpu_info.get("reason"),
        system=live.system,
        warnings=warnings,
        error=live.error,
        **_where_time_goes(sampled),
        **_ceiling(live, steady, log, skip, per_batch, sampled, [w.code for w in warnings],
                   workers),
    )


def _ceiling(live: RunSoFar, steady: metrics.SteadyState | None, log: BatchLog, skip: int,
             per_batch: dict[str, Any] | None, sampled: dict[str, Any] | None,
             codes: list[str], workers: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """The ceiling of a run with workers, read from its own figures (ceiling.measured_cost),
    what would raise it and the fixes named; none where they cannot be read. The CPUs counted
    are the machine's budget (its cores less the other load seen as the run started), or what
    the loader's processes were seen using, where more: other load comes and goes."""
    main = _main_process(live) or {}
    consumer = live.consumer
    # (each kept row weighing the batches it stands for, where rows are kept in windows)
    step_s = (log.median(lambda b: b.step_s, skip)
              if consumer is not None and consumer.steps else None)
    step_ms = 1000.0 * step_s if step_s is not None else 0.0
    used = sum((p.get("cpu_percent") or 0.0) for p in (*workers, main)) / 100.0
    cost = measured_cost(
        per_batch, main.get("cpu_percent"), steady.batches_per_s if steady else None,
        steady.samples_per_s if steady else None, step_ms,
        consumer.kind if consumer is not None else "none",
        max(live.system.cpu_budget() if live.system is not None else 1.0, used),
        int((live.config or {}).get("num_workers") or 0), DEFAULT_MAX_WORKERS,
        main.get("busiest_thread_percent"))
    if cost is None or steady is None:
        return {}
    return ceiling_fields(cost, sampled, steady.samples_per_s, codes,
                          live.system is not None and live.system.gpu_available)


def _where_time_goes(merged: dict[str, Any] | None) -> dict[str, Any]:
    """The result's stages and hotspots (analyse/hotspots.py); none where too few looks to
    show shares as a claim (the figures of what was seen stay under ``stacks_sampled``)."""
    if merged is None:
        return {}
    seen = {k: merged[k] for k in ("looks", "seconds", "processes", "enough", "sampling_share")}
    if not merged["enough"]:
        return {"stacks_sampled": seen}
    return {"stacks_sampled": seen, "stages": tuple(merged["stages"]),
            "hotspots": tuple(merged["hotspots"]), "flame": tuple(merged["flame"]),
            "stacks_collapsed": merged["collapsed"]}


def tune_result(live: RunSoFar, status: str) -> TuneResult:
    """The tune's result: the child's recommendation plus what the parent knows (status,
    errors, what the user's code printed)."""
    printed = tuple(live.output.diagnostics())
    # The fields both ways share, as keyword arguments (of several types: hence Any).
    common: dict[str, Any] = dict(
        status=status, target=live.target,
        dataset=live.dataset, system=live.system, consumer=live.consumer,
        torch=live.torch_version, error=live.error)
    if live.tune_document is not None:
        tuned = TuneResult.from_dict({**live.tune_document, "status": status})
        return dataclasses.replace(tuned, **common, warnings=printed + tuned.warnings)
    if status == "ok":
        common.update(status="error", error=common["error"] or RunError(
            "The tuner stopped before reaching a recommendation.",
            type="tune_incomplete"))
    return TuneResult(**common, trials=tuple(live.trials), warnings=printed)


def _counting(rules: dict[str, Any] | None, measured: list[BatchRecord], count: int,
              timed_batches: int, windows: dict[str, Any] | None) -> dict[str, Any] | None:
    """How each figure was counted, with how many of the ``count`` batches measured had their
    making timed and their CPU time and bytes read (``measured``: their rows, all of them or,
    with windows, a sample holding every timed one)."""
    if rules is None:
        return None

    def on(share: float | None, rule: str) -> str:  # the rule is the child's (probes.py)
        return ("every batch" if share is None or share >= 1.0
                else f"{share:.0%} of batches ({rules.get(rule, 'sampled')})")

    timed_share = timed_batches / count if count else None
    read = sum(1 for b in measured if b.fetch_cpu_s is not None) / count if count else None
    return {**rules, "cpu_time_and_bytes_read_on": on(read, "reads"),
            "making_timed_on": on(timed_share, "making"),
            **({"windows": windows} if windows else {})}


def _resource_stats(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Mean CPU % over samples and the last RSS. A process's first sample has no CPU reading
    (psutil's first call only primes the counter), so short-lived workers may have none."""
    cpu = [r["cpu_percent"] for r in rows if r["cpu_percent"] is not None]
    busiest: list[float] = [r["busiest_thread_percent"] for r in rows
                            if r.get("busiest_thread_percent") is not None]
    return {
        "cpu_percent": sum(cpu) / len(cpu) if cpu else None,
        **({"busiest_thread_percent": sum(busiest) / len(busiest)} if busiest else {}),
        "rss_mb": next((r["rss_mb"] for r in reversed(rows) if r["rss_mb"]), None),
    }


def _workers(live: RunSoFar, log: BatchLog, window: tuple[float, float]
             ) -> list[dict[str, Any]]:
    """One entry per DataLoader worker id; without persistent_workers each epoch starts new
    processes for the same ids, so ``pids`` lists them all and ``pid`` is the latest."""
    counts = log.worker_batches()
    busy = metrics.busy_fraction(log.rows, *window, counts=counts)
    pid_to_id = {b.worker_pid: b.worker_id for b in log.rows if b.worker_id >= 0}
    for row in live.resources:
        if row["role"] == "worker" and row["worker_id"] is not None:
            pid_to_id.setdefault(row["pid"], row["worker_id"])
    workers: list[dict[str, Any]] = []
    for worker_id in sorted(set(pid_to_id.values())):
        pids = [pid for pid, wid in pid_to_id.items() if wid == worker_id]
        rows = [r for r in live.resources if r["pid"] in pids]
        workers.append({
            "id": worker_id,
            "pid": pids[-1],
            "pids": pids,
            "busy_frac": busy.get(worker_id, 0.0),
            "batches": counts.get(worker_id, 0),
            **_resource_stats(rows),
        })
    return workers


def _main_process(live: RunSoFar) -> dict[str, Any] | None:
    rows = [r for r in live.resources if r["role"] == "main"]
    if not rows:
        return None
    return {"pid": rows[0]["pid"], **_resource_stats(rows)}


def _transfer(batches: list[BatchRecord]) -> dict[str, Any] | None:
    copies = [b.h2d_ms for b in batches if b.h2d_ms is not None]
    others = [b.h2d_other_ms for b in batches if b.h2d_other_ms is not None]
    if not copies:
        return None
    sizes = [b.nbytes for b in batches if b.h2d_ms is not None and b.nbytes is not None]
    p50 = metrics.percentile(copies, 50)
    size_p50 = metrics.percentile(sizes, 50)
    # No rate when no timed batch had its bytes read (they are read on some batches only).
    gb_per_s = (size_p50 / 1e9) / (p50 / 1000) if p50 and size_p50 is not None else None
    return {
        "copy_ms": {"p50": p50, "p95": metrics.percentile(copies, 95)},
        "other_kind_copy_ms": {"p50": metrics.percentile(others, 50)} if others else None,
        "gb_per_s": gb_per_s,
    }


def _gpu_idle(log: BatchLog, warmup: int) -> dict[str, Any] | None:
    """The GPU's idle gaps after the warm-up: percentiles of the even sample, the largest and
    the sum exact (record/windows.py keeps them in windows)."""
    found = log.gpu_gaps_ms(warmup)
    if found is None:
        return None
    sample, total, largest = found
    return {"gap_ms": {"p50": metrics.percentile(sample, 50),
                       "p95": metrics.percentile(sample, 95), "max": largest},
            "total_ms": total}


def _warnings(live: RunSoFar, steady: metrics.SteadyState | None, made: list[TimedBatch],
              per_batch: dict[str, float | None], gpu_info: dict[str, Any]) -> list[Diagnostic]:
    """The pitfalls this run shows (pitfalls.py), after the engine's own warnings."""
    config = live.config or {}
    system = live.system
    workers = config.get("num_workers") or 0
    found: list[Diagnostic] = []
    length = live.dataset.length if live.dataset is not None else None
    if live.error is None and live.finished_reason is not None:  # not while a run is starting
        found += pitfalls.short_run(steady.batches if steady else 0, live.warmup_batches)
        if steady is not None and steady.batches >= pitfalls.MIN_STEADY_BATCHES:
            found += pitfalls.measuring_cost(steady.batches_per_s, steady.samples_per_s)
    found += pitfalls.pin_memory_without_gpu(config, bool(gpu_info.get("available")))
    found += pitfalls.duplicated_rng(live.probes)
    if live.label_source == "dataset":  # every label, read from the dataset: order is moot
        found += pitfalls.skewed_labels(live.label_counts, True,
                                        length, source="dataset")
    else:
        found += pitfalls.skewed_labels(live.label_counts,
                                        pitfalls.label_order(config, live.dataset),
                                        length)
    found += worker_memory_growth(live.resources)
    if system is not None:  # the machine as the child saw it (none if it failed first)
        shm_now = tightest_shm(live.resources, system.shm)
        found += shm_check(config, live.dataset, shm_now or system.shm, live.ranks_on_node,
                           per_batch["bytes"], in_use=shm_now is not None)
        found += pitfalls.cpu_oversubscription(workers, system, pitfalls.cpu_share_of(made),
                                               live.tuned_workers)
    fetch_ms, collate_ms = per_batch["fetch_ms"], per_batch["collate_ms"]
    making_s = (fetch_ms + (collate_ms or 0.0)) / 1000 if fetch_ms is not None else None
    if workers and system is not None:
        found += oversubscription.thread_oversubscription(
            live.probes, live.resources, workers, system.cores, per_batch["fetch_cpu_ms"],
            live.stacks.torch_threads)
    found += pitfalls.restarts_each_epoch(config, live.epochs, live.elapsed_s, making_s)
    found += overdue_batches(live.overdue, live.batches)
    return found
