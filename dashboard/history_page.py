"""Saved runs from the SQLite store: list them, compare two side by side, export a trace."""

from __future__ import annotations

import json
import time

import streamlit as st

from dataloader_tuner import ProfileResult, StoredRun
from dataloader_tuner.ui import (HISTORY_MAX_GB_ENV, HistoryLimits, chrome_trace,
                                 history_limits_in_env, history_size_text, save_history_limits,
                                 settle_dead_runs)

from . import charts, views
from .shared import get_jobs

MEASURED_KINDS = ("profile", "verify")


def _label(run: StoredRun) -> str:
    when = time.strftime("%m-%d %H:%M:%S", time.localtime(run.started_at))
    extra = f" {run.label}" if run.label else ""
    return f"#{run.id} {run.kind}{extra} {when}: {run.target}"


def _table(runs: list[StoredRun]) -> None:
    rows = []
    for run in runs:
        rows.append({
            "id": run.id, "kind": run.kind, "label": run.label, "status": run.status,
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started_at)),
            "target": run.target,
            "samples/s": None if run.samples_per_s is None else round(run.samples_per_s, 1),
            "settings": run.result.snippet if run.result is not None else None,
            "error": (run.error or {}).get("message"),
        })
    st.dataframe(rows, hide_index=True)


def _measured(run: StoredRun) -> ProfileResult | None:
    """The figures of a run that measured one setting (a tune's result has none)."""
    return run.result if isinstance(run.result, ProfileResult) else None


def _side(run: StoredRun, side: str) -> None:
    """One side of the comparison; ``side`` keys its charts (both sides may show one run)."""
    result = _measured(run)
    st.markdown(f"**{_label(run)}**")
    if result is not None and result.snippet:
        st.code(result.snippet, language="python")
    if run.error:
        views.error_card(run.error)
    lat = (result.batch_latency_ms if result is not None else None) or {}
    idle = views.input_wait_share(result) if result is not None else None
    cols = st.columns(4)
    cols[0].metric("samples/s", views.fmt(run.samples_per_s))
    cols[1].metric("p50 wait", views.fmt(lat.get("p50"), ".2f", " ms"))
    cols[2].metric("p95 wait", views.fmt(lat.get("p95"), ".2f", " ms"))
    cols[3].metric("input wait", views.fmt(None if idle is None else idle * 100, ".1f", " %"))
    where = views.sampled_of(result) if result is not None else None
    if where:
        with st.expander("Where the time goes"):
            views.where_time_goes(where, key=f"history-{side}-{run.id}",
                                  name=f"run {run.id}: {run.target}")


def _size_text(path: str) -> str:
    """The history's size and its limits, or why they cannot be read (a bad limit set)."""
    try:
        return history_size_text(path, HistoryLimits.for_history(path))
    except ValueError as exc:
        return str(exc)


def _limits_form(path: str) -> None:
    """The history's limits, saved in it for every job writing there (NOTE [ Keeping the
    history within its limits ], store/retention.py)."""
    with st.expander("Size and age limits"):
        try:
            limits = HistoryLimits.for_history(path)
        except ValueError as exc:  # a bad value in the environment: said, not raised
            st.error(str(exc))
            return
        overridden = history_limits_in_env()
        if overridden:
            st.caption(f"Set here by {', '.join('$' + name for name in overridden)}: a job "
                       "started with it keeps that instead of what is saved below.")
        with st.form("history-limits"):
            cols = st.columns(2)
            gb = cols[0].number_input("Size limit (GB, 0: none)", min_value=0.0,
                                      value=(limits.max_bytes or 0.0) / 1024 ** 3, step=0.5)
            days = cols[1].number_input("Keep runs for (days after they end, 0: always)",
                                        min_value=0.0,
                                        value=(limits.max_age_s or 0.0) / 86400.0, step=1.0)
            if st.form_submit_button("Save limits"):
                save_history_limits(path, gb, days)
                st.success("Saved in this history: each job writing here keeps within them "
                           "from its next run; `dataloader-tuner runs --prune` applies them now.")


def render() -> None:
    store = get_jobs().store
    st.title("Run history")
    about = st.empty()  # (filled after the limits' form: a limit just saved is shown)
    _limits_form(store.path)
    about.caption(f"Every run is saved as it goes in `{store.path}`. "
                  f"{_size_text(store.path)}: `dataloader-tuner runs --prune` keeps it there "
                  f"(`--max-gb`, `--max-days`, ${HISTORY_MAX_GB_ENV}, or the limits below).")
    settle_dead_runs(store)  # NOTE [ Runs ended without a word ] (engine/run/settle.py)
    runs = store.list_runs(500)
    if not runs:
        st.info("No runs saved yet. Start one on the Live page, or run "
                "`python -m dataloader_tuner profile TARGET`.")
        return
    _table(runs)
    measured = {r.id: r for r in runs if r.kind in MEASURED_KINDS}
    if not measured:
        return
    ids = list(measured)
    st.subheader("Compare two runs")
    cols = st.columns(2)
    first = cols[0].selectbox("Run A", ids, index=min(1, len(ids) - 1),
                              format_func=lambda i: _label(measured[i]))
    second = cols[1].selectbox("Run B", ids, index=0, format_func=lambda i: _label(measured[i]))
    if first is None or second is None:  # only with no options, which is returned above
        return
    with cols[0]:
        _side(measured[first], "a")
    with cols[1]:
        _side(measured[second], "b")
    batches = {run_id: store.batches(run_id) for run_id in {first, second}}
    windows = [store.windows(run_id) for run_id in (first, second)]  # fast batches' (if any)
    series = []
    for run_id in (first, second):
        result = _measured(measured[run_id])
        series.append((f"run {run_id}", batches[run_id],
                       result.warmup_batches if result is not None else 0))
    st.plotly_chart(charts.compare_throughput_figure([(label, b) for label, b, _ in series],
                                                     windows), key="compare-throughput")
    st.plotly_chart(charts.compare_latency_figure(series, windows), key="compare-latency")

    st.subheader("Export a trace")
    st.caption("Chrome trace JSON: workers and the main process on one timeline. Open it in "
               "https://ui.perfetto.dev or chrome://tracing.")
    chosen = st.selectbox("Run to export", ids, format_func=lambda i: _label(measured[i]))
    if chosen is None:
        return
    trace = chrome_trace(batches[chosen] if chosen in batches else store.batches(chosen),
                         store.resources(chosen), label=f"run {chosen}: {measured[chosen].target}",
                         windows=store.windows(chosen))
    st.download_button("Download Perfetto trace", json.dumps(trace),
                       file_name=f"dataloader-tuner-run-{chosen}.trace.json",
                       mime="application/json")
