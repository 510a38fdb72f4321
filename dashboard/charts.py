"""Plotly figures for the dashboard: pure functions, data in, figure out.

No Streamlit and no engine state here, so each figure is unit-tested on hand-made records.
Long runs are binned before plotting (``MAX_POINTS``): the live view redraws every second and
the browser should get a few kilobytes, not every batch of a 100k-batch run. Series go in as
numpy arrays and no plotly template is set (Streamlit applies its own theme): plotly validates
lists element by element and a template costs ~15 ms per figure, which the server would pay
every second while a run streams (bench/dashboard_cpu.py).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from dataloader_tuner.ui import BatchLog, BatchRecord, BatchWindow, epoch_starts, timed


MAX_POINTS = 600  # per series, before binning
TIMELINE_BATCHES = 240  # the worker timeline shows the most recent batches...
TIMELINE_SECONDS = 2.0  # ...of the last two seconds, so each bar is wide enough to see
COLORS = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6",
          "#9D755D", "#BAB0AC", "#EECA3B"]
FETCH_COLOR, COLLATE_COLOR = "#4C78A8", "#F58518"


def _axis(title: str, **extra) -> dict:
    return {"title": {"text": title}, **extra}


def _figure(traces: list, title: str, xaxis: dict, yaxis: dict, height: int = 320,
            **layout) -> go.Figure:
    """One constructor call with a plain layout dict: ``update_xaxes(title_text=...)`` and
    friends parse their magic keyword names on every call, which showed up in the profile."""
    return go.Figure(data=traces, layout={
        "title": {"text": title, "x": 0.01}, "height": height,
        "margin": {"l": 50, "r": 20, "t": 60, "b": 40},
        "legend": {"orientation": "h", "y": -0.25}, "xaxis": xaxis, "yaxis": yaxis, **layout})


def binned(x: Sequence[float], y: Sequence[float], max_points: int = MAX_POINTS
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(x, median y, max y) per bin when there are more than ``max_points`` points; else the
    points themselves and None. Maxima are kept so a binned chart still shows the spikes.
    ``x`` must be sorted (times of consecutive batches are)."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(xs) <= max_points:
        return xs, ys, None
    edges = np.linspace(xs[0], xs[-1], max_points // 2 + 1)
    bounds = np.unique(np.searchsorted(xs, edges[:-1], side="left"))
    limits = np.append(bounds[1:], len(xs))
    sizes = limits - bounds
    # each bin's values sorted in place of a median per bin (300 of them: 0.05 s a chart)
    in_bins = ys[np.lexsort((ys, np.repeat(np.arange(len(bounds)), sizes)))]
    medians = (in_bins[bounds + (sizes - 1) // 2] + in_bins[bounds + sizes // 2]) / 2
    return (xs[bounds] + xs[limits - 1]) / 2, medians, np.maximum.reduceat(ys, bounds)


def batch_latency_figure(batches: Sequence[BatchRecord], warmup: int = 0,
                         windows: Sequence[BatchWindow] = ()) -> go.Figure:
    """Per-batch wait in ``next()`` over time (left) and its distribution after warm-up (right).
    ``windows``: where fast batches were kept in windows, the rows over time are their even
    sample and the distribution is every batch's, from the windows' histograms.

    The two panels are laid out by hand: ``make_subplots`` and ``add_vline`` cost more than
    the rest of the figure together.
    """
    log = BatchLog(batches, windows)
    measured = log.even_rows()[warmup:] if windows else batches[warmup:]
    xs, ys, maxima = binned([b.t_ready for b in measured], [b.wait_s * 1000 for b in measured])
    traces = []
    if maxima is None:
        traces.append(go.Scatter(x=xs, y=ys, mode="markers", name="wait (ms)",
                                 marker={"size": 4, "color": COLORS[0]}))
    else:
        traces.append(go.Scatter(x=xs, y=ys, mode="lines", name="median wait (ms)",
                                 line={"color": COLORS[0]}))
        traces.append(go.Scatter(x=xs, y=maxima, mode="lines", name="max wait (ms)",
                                 line={"color": COLORS[3], "width": 1}))
    if windows:  # the spikes an even sample misses: each window's slowest batch
        at, each, most = binned([w.t_end for w in windows], [w.wait_max_s * 1000 for w in windows])
        traces.append(go.Scatter(x=at, y=each if most is None else most, mode="lines",
                                 line={"color": COLORS[3], "width": 1},
                                 name="largest wait in a 0.1 s window (ms)"))
    starts = epoch_starts(batches)  # the warm-up's too: the first start-up is the longest
    if starts:
        traces.append(go.Scatter(
            x=[b.t_ready for b in starts], y=[b.wait_s * 1000 for b in starts], mode="markers",
            name="epoch start-up (ms)", marker={"size": 9, "symbol": "diamond",
                                                 "color": COLORS[1]},
            hovertemplate="epoch %{customdata} start-up: %{y:.0f} ms<extra></extra>",
            customdata=[b.epoch for b in starts]))
    seconds, weights = log.wait_counts(warmup)
    waits = np.array(seconds) * 1000
    if len(waits):
        counts, edges = np.histogram(waits, bins=min(40, max(sum(weights) // 5, 5)),
                                     weights=weights)
        traces.append(go.Bar(x=(edges[:-1] + edges[1:]) / 2, y=counts,
                             width=float(edges[1] - edges[0]), name="batches",
                             marker={"color": COLORS[0]}, showlegend=False, xaxis="x2", yaxis="y2"))
    shapes = []
    if warmup and len(batches) >= warmup:  # where the steady-state clock started
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "y0": 0, "y1": 1,
                       "x0": batches[warmup - 1].t_ready, "x1": batches[warmup - 1].t_ready,
                       "line": {"dash": "dot", "color": "gray"}})
    return _figure(traces, "Batch latency: how long each next() waited for a batch",
                   _axis("seconds since start", domain=[0, 0.6]),
                   _axis("wait in next() (ms)"),
                   xaxis2=_axis("wait (ms), after warm-up", domain=[0.7, 1], anchor="y2"),
                   yaxis2=_axis("batches", anchor="x2"), shapes=shapes)


def worker_utilization_figure(busy_rows: Sequence[dict]) -> go.Figure:
    """Busy % per worker per time window (rows from ``metrics.busy_timeline``)."""
    traces = []
    for worker in sorted({r["worker_id"] for r in busy_rows}):
        rows = [r for r in busy_rows if r["worker_id"] == worker]
        name = "main process" if worker < 0 else f"worker {worker}"
        traces.append(go.Scatter(x=np.array([r["t"] for r in rows]),
                                 y=np.array([r["busy_frac"] for r in rows]) * 100,
                                 mode="lines+markers", name=name,
                                 line={"color": COLORS[(worker + 1) % len(COLORS)], "shape": "hv"}))
    return _figure(traces, "Worker utilization: busy % per worker over time",
                   _axis("seconds since start"), _axis("busy making batches (%)", range=[0, 105]))


def worker_timeline_figure(batches: Sequence[BatchRecord], last_n: int = TIMELINE_BATCHES,
                           last_s: float = TIMELINE_SECONDS) -> go.Figure:
    """Which worker made which batch, split into dataset fetch and collate time."""
    recent = timed(batches[-last_n:])  # fast batches' making is timed on a sample
    if recent:
        since = max(b.worker_end for b in recent) - last_s
        recent = [b for b in recent if b.worker_end >= since]
    rows = np.array([("main process" if b.worker_id < 0 else f"worker {b.worker_id}")
                     for b in recent])
    seq = np.array([b.seq for b in recent])
    start = np.array([b.fetch_start for b in recent]) * 1000
    fetch = np.array([b.fetch_s for b in recent]) * 1000
    collate = np.array([b.collate_s for b in recent]) * 1000
    traces = []
    # collate first: a batch's few-pixel bars anti-alias into each other, fetch on top
    traces.append(go.Bar(y=rows, x=collate, base=start + fetch, orientation="h",
                         customdata=seq, hovertemplate="batch %{customdata}: collate %{x:.2f} ms",
                         name="collate",
                         marker={"color": COLLATE_COLOR, "line": {"width": 0}}))
    traces.append(go.Bar(y=rows, x=fetch, base=start, orientation="h", customdata=seq,
                         hovertemplate="batch %{customdata}: fetch %{x:.2f} ms",
                         name="fetch (dataset)",
                         marker={"color": FETCH_COLOR, "line": {"width": 0}}))
    return _figure(traces, "Worker utilization: which worker made each batch",
                   _axis(f"ms since start (the last {len(recent)} batches)"),
                   _axis("", categoryorder="category descending"), barmode="overlay")


def transfer_figure(batches: Sequence[BatchRecord], pin_memory: bool) -> go.Figure | None:
    """Host-to-device copy time per batch, pinned vs pageable; None when nothing was timed."""
    timed = [b for b in batches if b.h2d_ms is not None]
    if not timed:
        return None
    this_kind, other_kind = ("pinned", "pageable") if pin_memory else ("pageable", "pinned")
    traces = []
    traces.append(go.Scatter(x=[b.seq for b in timed], y=[b.h2d_ms for b in timed],
                             mode="markers", name=f"{this_kind} (this run's batches)",
                             marker={"size": 4, "color": COLORS[0]}))
    others = [b for b in timed if b.h2d_other_ms is not None]
    if others:
        traces.append(go.Scatter(x=[b.seq for b in others], y=[b.h2d_other_ms for b in others],
                                 mode="markers", name=f"{other_kind} (same batch, sampled)",
                                 marker={"size": 6, "color": COLORS[1], "symbol": "x"}))
    return _figure(traces, "Pinned-memory transfer: host-to-device copy time per batch",
                   _axis("batch"), _axis("host-to-device copy (ms)", rangemode="tozero"))


def idle_gaps_figure(batches: Sequence[BatchRecord], gpu_measured: bool) -> go.Figure:
    """The gaps the step waits for input: GPU gaps from CUDA events, else the consumer's waits."""
    if gpu_measured:
        timed = [b for b in batches if b.gpu_gap_ms is not None]
        gaps = [b.gpu_gap_ms for b in batches if b.gpu_gap_ms is not None]
        title = "GPU idle gaps: time the GPU waited for the next batch"
        axis = "GPU idle gap (ms)"
    else:
        timed = list(batches)
        gaps = [b.wait_s * 1000 for b in timed]
        title = "GPU idle gaps (no GPU): the consumer's waits instead"
        axis = "consumer idle gap (ms)"
    xs, ys, maxima = binned([b.t_request for b in timed], gaps)
    traces = []
    if maxima is None:
        traces.append(go.Bar(x=xs, y=ys, name="gap", marker={"color": COLORS[3]}))
    else:
        traces.append(go.Scatter(x=xs, y=maxima, mode="lines", name="largest gap per bin",
                                 fill="tozeroy", line={"color": COLORS[3]}))
        traces.append(go.Scatter(x=xs, y=ys, mode="lines", name="median gap per bin",
                                 line={"color": COLORS[0]}))
    return _figure(traces, title, _axis("seconds since start"),
                   _axis(axis, rangemode="tozero"))


def tune_figure(trials: Sequence[dict], recommended_workers: int | None = None) -> go.Figure:
    """Throughput against num_workers, one point per measured trial, the pick highlighted."""
    searched = [t for t in trials if t.get("phase") not in
                ("baseline", "final", "in_order", "out_of_order", "threads_default",
                 "threads_one", "heap_fresh") and t.get("samples_per_s")]
    unordered = [t for t in trials if t.get("phase") == "out_of_order" and t.get("samples_per_s")]
    # the worker count where one thread per pool was measured against the pools as they start
    pools = [t for t in trials if t.get("phase") == "threads_default" and t.get("samples_per_s")]
    # the worker count measured in workers started fresh, without KeepFreedMemory
    fresh = [t for t in trials if t.get("phase") == "heap_fresh" and t.get("samples_per_s")]
    final = [t for t in trials if t.get("phase") == "final" and t.get("samples_per_s")]
    traces = []
    traces.append(go.Scatter(
        x=[t["num_workers"] for t in searched], y=[t["samples_per_s"] for t in searched],
        mode="markers", name="trial", marker={"size": 9, "color": COLORS[0]},
        hovertext=[f"{t.get('phase')} #{t.get('repeat', 0)}" for t in searched]))
    best: dict[int, list[float]] = {}
    for t in searched:
        best.setdefault(t["num_workers"], []).append(t["samples_per_s"])
    order = sorted(best)
    traces.append(go.Scatter(x=order, y=[float(np.median(best[n])) for n in order],
                             mode="lines", name="median per setting",
                             line={"color": COLORS[0], "dash": "dot"}))
    # the trials outside the search, each kind its own marker
    for apart, name, symbol, color in (
            (unordered, "in_order=False", "x", COLORS[2]),  # tune/order.py
            (pools, "each library's threads as they start", "circle-open", COLORS[3]),
            (fresh, "workers started fresh, freed memory given back", "square-open", COLORS[4]),
    ):  # the last two: tune/thread_pools.py, tune/heap_check.py
        if apart:
            traces.append(go.Scatter(x=[t["num_workers"] for t in apart],
                                     y=[t["samples_per_s"] for t in apart], mode="markers",
                                     name=name, marker={"size": 10, "symbol": symbol,
                                                        "color": color}))
    baseline = [t for t in trials if t.get("phase") == "baseline" and t.get("samples_per_s")]
    if baseline:
        traces.append(go.Scatter(x=[b["num_workers"] for b in baseline],
                                 y=[b["samples_per_s"] for b in baseline], mode="markers",
                                 name="current settings", marker={"size": 11, "symbol": "diamond",
                                                                  "color": COLORS[1]}))
    if recommended_workers is not None and (final or recommended_workers in best):
        # The recommendation as measured with all its settings, if it was (see child/tuning.py).
        y = final[-1]["samples_per_s"] if final else float(np.median(best[recommended_workers]))
        traces.append(go.Scatter(x=[recommended_workers], y=[y],
                                 mode="markers", name="recommended",
                                 marker={"size": 16, "symbol": "star", "color": COLORS[2]}))
    ranks = max((t.get("ranks_measured") or 1 for t in trials), default=1)
    per = f" per rank, {ranks} loaders at once" if ranks > 1 else ""
    return _figure(traces, "Tune: throughput against num_workers", _axis("num_workers"),
                   _axis(f"samples/s (steady state){per}", rangemode="tozero"))


def throughput_over_time(batches: Sequence[BatchRecord], bin_s: float | None = None,
                         windows: Sequence[BatchWindow] = ()) -> tuple[list[float], list[float]]:
    """Samples/s in consecutive bins (by when batches arrived, a window's spread over its span);
    about 30 bins per run unless ``bin_s`` is given. The last, unfinished bin is left out: it
    would show a dip."""
    log = BatchLog(batches, windows)
    arrivals = log.arrivals()
    if not arrivals:
        return [], []
    end = max(t for _, t, _ in arrivals)
    if bin_s is None:
        # Workers deliver in rounds: a bin holding fewer batches than a round shows a sawtooth
        # between 0 and twice the rate. Bins hold at least 2 rounds (5 batches) on average.
        workers = len({b.worker_id for b in batches})
        per_batch = end / log.batches
        bin_s = max(min(max(end / 30, 0.1), 2.0), per_batch * max(5, 2 * workers))
    full = int(end // bin_s)
    counts = np.zeros(full)
    for start, stop, samples in arrivals:
        first, last = int(start // bin_s), int(stop // bin_s)
        for i in range(first, min(last, full - 1) + 1):  # a window: by its share of each bin
            share = (1.0 if last == first else
                     (min(stop, (i + 1) * bin_s) - max(start, i * bin_s)) / (stop - start))
            counts[i] += samples * share
    return [(i + 0.5) * bin_s for i in range(full)], (counts / bin_s).tolist()


def compare_throughput_figure(runs: Sequence[tuple[str, Sequence[BatchRecord]]],
                              windows: Sequence[Sequence[BatchWindow]] = ()) -> go.Figure:
    """Overlaid samples/s over time for several runs (``windows``: each run's, if any)."""
    traces = []
    for i, (label, batches) in enumerate(runs):
        x, y = throughput_over_time(batches, windows=windows[i] if windows else ())
        traces.append(go.Scatter(x=x, y=y, mode="lines+markers", name=label,
                                 line={"color": COLORS[i % len(COLORS)]}))
    return _figure(traces, "Throughput over time", _axis("seconds since start"),
                   _axis("samples/s", rangemode="tozero"))


def compare_latency_figure(runs: Sequence[tuple[str, Sequence[BatchRecord], int]],
                           windows: Sequence[Sequence[BatchWindow]] = ()) -> go.Figure:
    """Overlaid cumulative distributions of batch wait (after each run's warm-up; ``windows``:
    each run's, if any, whose histograms count their batches)."""
    traces = []
    for i, (label, batches, warmup) in enumerate(runs):
        seconds, weights = BatchLog(batches, windows[i] if windows else ()).wait_counts(warmup)
        if not seconds:
            continue
        order = np.argsort(seconds)
        waits = np.array(seconds)[order] * 1000
        shares = np.cumsum(np.array(weights)[order]) / sum(weights)
        step = max(len(waits) // MAX_POINTS, 1)
        traces.append(go.Scatter(x=waits[::step].tolist(), y=shares[::step].tolist(),
                                 mode="lines", name=label, line={"color": COLORS[i % len(COLORS)]}))
    return _figure(traces, "Batch latency: distribution compared",
                   _axis("wait in next() (ms)", type="log"),
                   _axis("share of batches", range=[0, 1.02]))


def where_time_goes_figure(flame: Sequence[dict]) -> go.Figure:
    """An icicle of the loader's sampled work: stages, then the functions each one's time was
    spent in (analyse/hotspots.py's ``flame``); sizes are shares of the work."""
    ids: list[str] = []
    labels: list[str] = []
    parents: list[str] = []
    values: list[float] = []
    stages: dict[str, float] = {}
    for leaf in flame:
        stages[leaf["stage"]] = stages.get(leaf["stage"], 0.0) + leaf["share"]
    for stage, share in stages.items():  # the stages side by side: the whole is their sum
        ids.append(stage)
        labels.append(f"{stage} {share:.0%}")
        parents.append("")
        values.append(share)
    for leaf in flame:
        ids.append(f"{leaf['stage']}/{leaf['function']}")
        labels.append(leaf["function"])
        parents.append(leaf["stage"])
        values.append(leaf["share"])
    return go.Figure(go.Icicle(ids=ids, labels=labels, parents=parents, values=values,
                               branchvalues="total", tiling={"orientation": "h"},
                               hovertemplate="%{label}: %{value:.1%} of the work<extra></extra>"),
                     layout={"title": {"text": "Where the loader's time goes (sampled)", "x": 0.01},
                             "height": 420, "margin": {"l": 10, "r": 10, "t": 50, "b": 10}})


WHAT_IFS_CHARTED = 8


def what_if_figure(what_if: Sequence[dict], measured: float | None) -> go.Figure:
    """Each change's samples/s (analyse/ceiling.py's ``what_if``), the largest gain on top,
    against the measured rate: predictions drawn hollow, a change measured (the cache) filled."""
    rows = list(what_if)[:WHAT_IFS_CHARTED][::-1]  # (plotly draws the first bar at the bottom)
    was_measured = [r.get("measured_samples_per_s") is not None for r in rows]
    figure = go.Figure(go.Bar(
        x=[r["measured_samples_per_s"] if m else r["predicted_samples_per_s"]
           for r, m in zip(rows, was_measured)], y=[r["change"] for r in rows],
        orientation="h", marker={"color": ["#4c78a8" if m else "rgba(0,0,0,0)"
                                           for m in was_measured], "line": {"width": 2}},
        text=["measured" if m else
              f"{r['predicted_gain']:.2f}x, then {r['then_binding'].replace('_', ' ')}"
              for r, m in zip(rows, was_measured)], textposition="auto",
        hovertemplate="%{y}: ~%{x:,.0f} samples/s<extra></extra>"))
    if measured:
        figure.add_vline(x=measured, line_dash="dash",
                         annotation_text=f"measured {measured:,.0f}", annotation_position="top")
    figure.update_layout(title={"text": "What would raise the ceiling", "x": 0.01},
                         xaxis_title="samples/s", height=80 + 34 * len(rows),
                         margin={"l": 10, "r": 10, "t": 50, "b": 40})
    return figure
