"""Export a run as Chrome trace JSON (opens in Perfetto, chrome://tracing, Speedscope).

One track per process: each DataLoader worker shows its fetch and collate per batch; the main
process shows the consumer's wait in ``next()`` and its step. A flow arrow links each batch
from the worker that made it to the moment the consumer received it. CPU % and RSS samples are
counters. Times in the trace are microseconds since the run started.
"""

from __future__ import annotations

from typing import Any, Sequence

from dataloader_tuner.record.rows import BatchRecord, timed
from dataloader_tuner.record.windows import KEEP_EVERY, BatchWindow

US = 1e6


def _complete(name: str, pid: int, start_s: float, dur_s: float,
              **args: int | None) -> dict[str, Any]:
    return {"ph": "X", "name": name, "cat": "loader", "pid": pid, "tid": pid,
            "ts": round(start_s * US, 3), "dur": round(max(dur_s, 0.0) * US, 3), "args": args}


def _process_name(pid: int, name: str, sort_index: int) -> list[dict[str, Any]]:
    return [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": pid, "args": {"name": name}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": pid,
         "args": {"sort_index": sort_index}},
    ]


def chrome_trace(batches: Sequence[BatchRecord], resources: Sequence[dict[str, Any]],
                 main_pid: int | None = None, label: str = "run",
                 windows: Sequence[BatchWindow] = ()) -> dict[str, Any]:
    """The trace document for one run's batches and resource samples; where fast batches
    were kept in ``windows`` (record/windows.py), a track of them beside the rows kept."""
    if main_pid is None:
        main_pid = next((r["pid"] for r in resources if r["role"] == "main"), 0)
    events: list[dict[str, Any]] = _process_name(main_pid, f"main process (consumer) - {label}", 0)
    workers = sorted({(b.worker_id, b.worker_pid) for b in batches if b.worker_id >= 0})
    for worker_id, pid in workers:
        events += _process_name(pid, f"DataLoader worker {worker_id} (pid {pid})", 1 + worker_id)
    for b in batches:
        batch_args = {"batch": b.seq, "epoch": b.epoch, "samples": b.samples, "bytes": b.nbytes}
        events.append(_complete("wait in next()", main_pid, b.t_request, b.wait_s, **batch_args))
        if b.step_s > 0:
            events.append(_complete("step", main_pid, b.t_ready, b.step_s, batch=b.seq))
    by_seq = {b.seq: b for b in batches}
    for t in timed(batches):  # where the making was timed (fast batches': a sample)
        maker = t.worker_pid if t.worker_id >= 0 else main_pid
        b = by_seq[t.seq]
        batch_args = {"batch": b.seq, "epoch": b.epoch, "samples": b.samples, "bytes": b.nbytes}
        events.append(_complete("fetch", maker, t.fetch_start, t.fetch_s, **batch_args))
        events.append(_complete("collate", maker, t.fetch_start + t.fetch_s, t.collate_s,
                                **batch_args))
        if t.worker_id >= 0:  # an arrow from the worker's collate end to the hand-off
            flow = {"name": "batch", "cat": "handoff", "id": b.seq}
            events.append({**flow, "ph": "s", "pid": maker, "tid": maker,
                           "ts": round(t.worker_end * US, 3)})
            events.append({**flow, "ph": "f", "bp": "e", "pid": main_pid, "tid": main_pid,
                           "ts": round(b.t_ready * US, 3)})
    if windows:
        events += _window_track(windows, main_pid)
    for row in resources:
        ts = round(row["t"] * US, 3)
        if row["cpu_percent"] is not None:
            events.append({"ph": "C", "name": "cpu %", "pid": row["pid"], "ts": ts,
                           "args": {"cpu %": row["cpu_percent"]}})
        if row["rss_mb"] is not None:
            events.append({"ph": "C", "name": "rss MB", "pid": row["pid"], "ts": ts,
                           "args": {"rss MB": row["rss_mb"]}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": "DataLoader Tuner", "run": label}}


WINDOWS_TID = 1  # the main process's track of windows: beside its kept rows' waits and steps


def _window_track(windows: Sequence[BatchWindow], main_pid: int) -> list[dict[str, Any]]:
    """Each window as one slice (its batches, samples, summed and largest wait and step) and
    the batches a second it held, as a counter: the rows kept among them are a sample."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "thread_name", "pid": main_pid, "tid": WINDOWS_TID,
         "args": {"name": f"batches in windows (one in {KEEP_EVERY} kept as a row)"}}]
    for w in windows:
        span = w.t_end - w.t_start
        events.append({**_complete(f"{w.batches} batches", main_pid, w.t_start, span,
                                   first_batch=w.first_seq, epoch=w.epoch, samples=w.samples),
                       "tid": WINDOWS_TID})
        events[-1]["args"].update(wait_ms=round(w.wait_s * 1e3, 3),
                                  wait_max_ms=round(w.wait_max_s * 1e3, 3),
                                  step_ms=round(w.step_s * 1e3, 3))
        if span > 0:
            events.append({"ph": "C", "name": "batches/s", "pid": main_pid,
                           "ts": round(w.t_start * US, 3),
                           "args": {"batches/s": round(w.batches / span, 1)}})
    return events
