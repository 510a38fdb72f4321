"""Streamlit pieces shared by the pages: headline figures, the charts of one run, the system
panel, warnings and error cards. Each takes the engine's types (a run's ProfileResult, its batch
records, diagnostics) so the live page and the history page show a run the same way."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import psutil
import streamlit as st

from dataloader_tuner import EngineError, ProfileResult
from dataloader_tuner.ui import (LOOP_TIME, BatchLog, BatchRecord, BatchWindow, Diagnostic,
                                 SystemSnapshot, busy_timeline, counting_text, fmt, sampled_basis,
                                 speedscope_document, startup_text, windows_text)

from . import charts


def compact(value: float | None, unit: str = "") -> str:
    """A figure short enough for a narrow headline tile: 3-4 significant digits, k/M above
    10,000 (a 6-column row truncates "12345.67" to "123...")."""
    if value is None:
        return "n/a"
    size = abs(value)
    if size >= 1e6:
        return f"{value / 1e6:.2f}M{unit}"
    if size >= 1e4:
        return f"{value / 1e3:.1f}k{unit}"
    if size >= 100:
        return f"{value:.0f}{unit}"
    return f"{value:.3g}{unit}"


def error_card(error: EngineError | dict, output_tail: str | None = None) -> None:
    """The headline first, the traceback only on request (a stored run's error is the dict
    ``EngineError.to_dict`` wrote)."""
    if isinstance(error, EngineError):
        error = error.to_dict()
    st.error(f"**{error['message']}**", icon="🛑")
    details = (error.get("details") or "").strip()
    if details or output_tail:
        with st.expander("Details (traceback and the run's output)"):
            if details:
                st.code(details, language="text")
            if output_tail and output_tail.strip() and output_tail.strip() not in details:
                st.code(output_tail, language="text")


def headline(result: ProfileResult) -> None:
    """samples/s, batches/s, p50/p95 wait, consumer idle and the input-bound verdict."""
    lat = result.batch_latency_ms or {}
    cols = st.columns(6)
    cols[0].metric("samples/s", compact(result.samples_per_s),
                   help=f"{fmt(result.samples_per_s, ',.1f')} samples/s, steady state")
    cols[1].metric("batches/s", compact(result.batches_per_s))
    cols[2].metric("p50 batch wait", compact(lat.get("p50"), " ms"))
    cols[3].metric("p95 batch wait", compact(lat.get("p95"), " ms"))
    wait = input_wait_share(result)
    cols[4].metric("input wait", fmt(wait * 100 if wait is not None else None, ".1f", " %"),
                   help="The share of the loop's time spent waiting for data, each epoch's "
                        "start-up included (iter() starting the workers, then their first "
                        f"batch), as a loop timing its own data wait sees it. The loop's time: "
                        f"{LOOP_TIME}.")
    verdict = result.input_bound
    cols[5].metric("input-bound?", verdict.split()[0] if verdict else "n/a",
                   help="TensorBoard's input-pipeline-analyzer thresholds: waiting under 5 % is "
                        "not input-bound, 5-20 % moderately, over 20 % highly. Needs a consumer "
                        "(the module's train_step, a simulated step or a training loop); n/a "
                        "without one.")
    if result.input_wait is not None:
        startup = startup_text(result.input_wait)
        st.caption((f"Epoch start-up: {startup}. " if startup else "")
                   + (f"Steady state (after the first {result.warmup_batches} batches), the "
                      f"loop waited {result.consumer_idle_frac:.1%} of its time."
                      if result.consumer_idle_frac is not None else ""))
    if result.steady_batches is not None:
        counting = counting_text(result.counting) if result.counting else ""
        how = f" {counting[:1].upper()}{counting[1:]}." if counting else ""
        st.caption(f"{result.batches} batches in {result.seconds:.1f} s; figures are steady "
                   f"state, after the first {result.warmup_batches} (prefetched) batches.{how}")


def input_wait_share(result: ProfileResult) -> float | None:
    """The headline wait: the whole run's, start-ups included (runs saved before it existed
    have the steady state's only)."""
    if result.input_wait is not None:
        return result.input_wait["share"]
    return result.consumer_idle_frac


def run_charts(result: ProfileResult, batches: Sequence[BatchRecord], key: str,
               windows: Sequence[BatchWindow] = ()) -> None:
    """The four charts of one run. ``windows``: where fast batches were folded, the rows are a
    sample (NOTE [ Windows for fast loaders ]): the busy shares are scaled by their counts."""
    if windows and result.counting and result.counting.get("windows"):
        st.caption(f"In these charts {windows_text(result.counting['windows'])}.")
    warmup = result.warmup_batches or 0
    # (a batch's making ends before the loop has it: its arrival bounds the workers' too)
    end = max((b.t_ready + b.step_s for b in batches), default=0.0)
    start = batches[0].t_request if batches else 0.0
    if start < 1.0:  # a whole run: from its start
        start = 0.0
        end = max(end, result.seconds or 0.0)
    left, right = st.columns(2)
    with left:
        st.plotly_chart(charts.batch_latency_figure(batches, warmup, windows),
                        key=f"{key}-latency")
    with right:
        window = 1.0 if end - start > 5 else 0.5
        st.plotly_chart(charts.worker_utilization_figure(
            busy_timeline(batches, end, window, start,
                          BatchLog(batches, windows).worker_batches() if windows else None)),
            key=f"{key}-busy")
    left, right = st.columns(2)
    with left:
        st.plotly_chart(charts.worker_timeline_figure(batches), key=f"{key}-timeline")
    with right:
        gpu = bool(result.gpu_idle)
        st.plotly_chart(charts.idle_gaps_figure(batches, gpu_measured=gpu), key=f"{key}-gaps")
        if not gpu:
            st.caption("GPU idle gaps not measured: "
                       f"{result.not_measured or 'no GPU timings in this run'}. Shown instead: "
                       "the consumer's waits in next() between steps.")
    transfer = charts.transfer_figure(batches, bool((result.config or {}).get("pin_memory")))
    if transfer is not None:
        st.plotly_chart(transfer, key=f"{key}-transfer")
    else:
        st.info("**Pinned-memory transfer**: not measured: "
                f"{result.not_measured or 'no host-to-device copies were timed in this run'}.",
                icon="ℹ️")


def workers_table(result: ProfileResult) -> None:
    rows = [{"worker": str(w["id"]), "pid": w["pid"],
             "busy %": round((w["busy_frac"] or 0) * 100, 1),
             "CPU %": None if w["cpu_percent"] is None else round(w["cpu_percent"], 1),
             "RSS MB": None if w["rss_mb"] is None else round(w["rss_mb"]),
             "batches": w["batches"]} for w in result.workers]
    main = result.main_process
    if main:
        rows.append({"worker": "main", "pid": main["pid"], "busy %": None,
                     "CPU %": None if main["cpu_percent"] is None else round(main["cpu_percent"], 1),
                     "RSS MB": None if main["rss_mb"] is None else round(main["rss_mb"]),
                     "batches": None})
    if rows:
        st.dataframe(rows, hide_index=True)


def system_panel(snap: SystemSnapshot | None, gpu_samples: Sequence[dict] = (),
                 live: bool = True) -> None:
    """Usable CPUs and their load, RAM, /dev/shm, and the GPU (or why there is none)."""
    if snap is None:
        return
    cols = st.columns(4)
    cols[0].metric("usable CPUs", f"{snap.cores:g}",
                   help=f"{snap.cpus_logical} logical CPUs; usable = affinity "
                        f"({snap.cpus_usable})"
                        + (f" capped by the cgroup quota {snap.cpu_quota:.1f}" if snap.cpu_quota
                           else ""))
    load = f"{snap.other_load_cpus:.1f} CPUs busy elsewhere at start"
    if live:
        load += f"; machine now {psutil.cpu_percent(None):.0f} %"
    cols[0].caption(load)
    cols[1].metric("RAM available", f"{snap.ram_available_mb / 1024:.1f} GiB",
                   help=f"of {snap.ram_total_mb / 1024:.1f} GiB")
    shm = snap.shm
    if shm:
        cols[2].metric("/dev/shm free", f"{shm['free_mb']:.0f} MB",
                       help=f"of {shm['total_mb']:.0f} MB; worker batches travel through it")
    gpu = snap.gpu
    if snap.gpu_available:
        name = gpu.get("name", "GPU")
        cols[3].metric("GPU", name)
        if gpu_samples:
            last = gpu_samples[-1]
            cols[3].caption(f"util {last['util_percent']:.0f} %, memory "
                            f"{last['memory_used_mb']:.0f} MB (pynvml)")
    else:
        cols[3].metric("GPU", "none")
        cols[3].caption(f"Not measured: {gpu.get('reason', 'no GPU')}")


def warnings_list(warnings: Sequence[Diagnostic]) -> None:
    """Diagnostics: the message, and the fix as code where there is one."""
    for warning in warnings:
        show = st.info if warning.severity == "info" else st.warning
        show(f"**{warning.code}**: {warning.message}",
             icon="ℹ️" if warning.severity == "info" else "⚠️")
        if warning.fix:
            st.code(warning.fix, language="python")
        if warning.evidence.get("stack"):  # where a late batch was (analyse/overdue.py)
            with st.expander("Where it was: the Python stack"):
                st.code(warning.evidence["stack"], language="text")


def sampled_of(result: ProfileResult) -> dict[str, Any] | None:
    """A profile's sampled stacks merged in one document (analyse/hotspots.py's shape), as a tune's
    ``stacks`` already is."""
    if not result.stacks_sampled:
        return None
    return {**result.stacks_sampled, "stages": result.stages, "hotspots": result.hotspots,
            "flame": result.flame, "collapsed": result.stacks_collapsed}


def where_time_goes(merged: dict[str, Any] | None, key: str, name: str) -> None:
    """The loader's sampled work by stage and function (docs/profile.md): the icicle, the
    stage table and the stacks for speedscope, or why there are none. ``merged``:
    hotspots.py's merged stacks; ``name``: what the export calls the run."""
    if not merged:
        return
    basis = sampled_basis(merged)
    if not merged.get("enough") or not merged.get("stages"):
        st.caption(f"Where the time goes: too few samples to tell yet ({basis}).")
        return
    st.markdown(f"**Where the time goes** (sampled inside the loader's processes: {basis})")
    st.plotly_chart(charts.where_time_goes_figure(merged["flame"]), key=f"{key}-where")
    # one under the other: side by side, in the History page's half-width comparison, the
    # stage table's figures were cut off
    st.dataframe([{"stage": s["stage"], "share %": round(s["share"] * 100, 1),
                   "off CPU %": round((s["share"] - s["cpu_share"]) * 100, 1)}
                  for s in merged["stages"]], hide_index=True)
    st.dataframe([{"function": h["function"], "total %": round(h["total_share"] * 100, 1),
                   "self %": round(h["self_share"] * 100, 1), "stage": h["stage"],
                   "where": f"{os.path.basename(h['file'])}:{h['line']}"}
                  for h in merged["hotspots"][:10]], hide_index=True)
    if merged.get("collapsed"):
        st.download_button("Download the stacks for speedscope",
                           json.dumps(speedscope_document(merged["collapsed"], name)),
                           file_name=f"dataloader-tuner-{key}.speedscope.json",
                           mime="application/json", key=f"{key}-speedscope",
                           help="Every sampled stack, for https://www.speedscope.app")


def ceiling_view(ceiling: dict[str, Any] | None, what_if: Sequence[dict[str, Any]],
                 fixes: Sequence[dict[str, Any]], key: str) -> None:
    """How far this machine can go for the dataset, what would raise it and the fixes named
    (docs/ceiling.md): the sentence, the what-if chart, the fixes' table."""
    if not ceiling:
        return
    st.markdown(f"**{ceiling['sentence']}**")
    st.plotly_chart(charts.what_if_figure(what_if, ceiling["measured_samples_per_s"]),
                    key=f"{key}-what-if")
    now = ceiling["measured_samples_per_s"]
    if fixes:
        st.dataframe([{"fix": f["fix"], "stage": f["stage"],
                       "predicted": f"{f['predicted_gain']:.2f}x" if f["predicted_gain"] else "",
                       "measured": (f"{f['measured_samples_per_s'] / now:.2f}x"
                                    if f.get("measured_samples_per_s") and now else ""),
                       "how": f["how"]} for f in fixes], hide_index=True)
    st.caption("Predicted from the cost model and the sampled profile, not measured (where a "
               "change was measured, its bar is filled): docs/ceiling.md.")
