"""Training jobs watched with ``engine.watch(loader)``: the runs other processes write into the
history, listed by job and followed live in the same view as the engine's own runs."""

from __future__ import annotations

import time

import streamlit as st

from engine import LiveRun, StoredRun, rank_figures, slowest_rank

from . import views
from .shared import get_jobs

REFRESH_S = 1.0
LIVE_WINDOW_BATCHES = 5000  # the live figures cover the most recent batches (as the Live page)


def _job_of(run: StoredRun) -> str:
    rank = run.rank
    where = (f"rank {rank['rank']}/{rank['world_size']}, node {rank['node_rank']}, "
             if rank else "")
    return f"{run.script or run.target} ({where}pid {run.pid} on {run.host})"


def _label(run: StoredRun) -> str:
    when = time.strftime("%m-%d %H:%M:%S", time.localtime(run.started_at))
    return f"#{run.id} {run.label or 'loader'} [{run.status}] {when}: {_job_of(run)}"


def _table(runs: list[StoredRun]) -> None:
    st.dataframe([{
        "run": run.id, "loader": run.label, "status": run.status, "job": _job_of(run),
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started_at)),
        "samples/s": None if run.samples_per_s is None else round(run.samples_per_s, 1),
    } for run in runs], hide_index=True)


def _run_view(run_id: int) -> None:
    """One watched run, re-read from the history on each refresh while it is running."""
    store = get_jobs().store
    run = store.get_run(run_id)
    if run is None:
        st.warning(f"Run {run_id} is no longer in the history.")
        return
    running = run.status == "running"
    live = LiveRun.stored(store, run_id, LIVE_WINDOW_BATCHES if running else None)
    result = run.result if run.result is not None else live.summary(
        "ok" if run.status in ("running", "lost") else run.status)
    st.markdown(f"**{run.label or 'loader'}** in `{_job_of(run)}`: **{run.status}**, "
                f"{live.elapsed_s:.1f} s, {len(live.batches)} batches"
                + (" (the most recent)" if running else ""))
    if run.status == "lost":
        st.warning("This job ended without a goodbye (killed, or crashed hard): shown up to "
                   "its last flush.", icon="⚠️")
    if run.error:
        views.error_card(run.error)
    if running:
        requested = store.tune_requested(run_id)
        st.button("Tune this job" if not requested else "Tuning requested", key=f"tune-{run_id}",
                  disabled=requested, on_click=store.request_tune, args=(run_id,),
                  help="The job tries worker counts in place from its next epoch, judged by its "
                       "own training loop, keeps the best and saves it (dataloader-tuner-"
                       "NAME.json in its working folder). What the model sees does not change.")
    _tuning_log(live.trials)
    if not live.batches:
        st.info("Waiting for the job's first batches...")
        return
    views.headline(result)
    st.caption("Input wait is the real one: the time your training loop spent in next(), "
               "against the time between batches (your step).")
    views.run_charts(result, live.batches, key=f"watched-{run_id}")
    with st.expander("Workers and the main process", expanded=False):
        views.workers_table(result)
    views.warnings_list(result.warnings)
    st.markdown("**System**")
    views.system_panel(result.system, live=running)


def _tuning_log(trials: list[dict]) -> None:
    """The in-place search's decisions, as the job logged them."""
    decisions = [t for t in trials if t.get("phase") == "in_place"]
    if not decisions:
        return
    st.markdown("**Tuning in place**")
    st.dataframe([{
        "num_workers": d.get("num_workers"),
        "samples/s": None if d.get("samples_per_s") is None else round(d["samples_per_s"], 1),
        "±": None if d.get("rate_ci") is None else f"{d['rate_ci']:.0%}",
        "decision": d.get("verdict"),
    } for d in decisions], hide_index=True)


WATCH_S = 2.0  # how often the page looks for jobs that started (or ended) since it was drawn


def _watch_for_changes(shown: dict[int, str]) -> None:
    """Re-draw the page when a watched run starts, or one shown changes status (a job that
    starts after the page was opened appears without a reload)."""
    if get_jobs().store.statuses("watch") != shown:
        st.rerun()


RANK_WINDOW_BATCHES = 2000  # each rank's figures: its most recent batches


def _ranks_view(runs: list[StoredRun]) -> None:
    """Each torchrun job's loaders, rank by rank, and the rank that holds the others back."""
    store = get_jobs().store
    jobs: dict[tuple, list[StoredRun]] = {}
    for run in runs:
        if run.rank:
            jobs.setdefault((run.rank["job_id"], run.label), []).append(run)
    for (job_id, label), ranks in jobs.items():
        if len(ranks) < 2:
            continue
        ranks.sort(key=lambda run: run.rank["rank"])
        figures = [rank_figures(run.rank["rank"], run.rank["node_rank"],
                                store.batches(run.id, RANK_WINDOW_BATCHES)) for run in ranks]
        st.markdown(f"**Job `{job_id}`, loader {label}: {len(ranks)} ranks**")
        st.dataframe([{
            "rank": f.rank, "node": f.node, "status": run.status,
            "samples/s": None if f.samples_per_s is None else round(f.samples_per_s, 1),
            "input wait %": (None if f.input_wait_frac is None
                             else round(100 * f.input_wait_frac, 1)),
            "step ms": None if f.step_ms is None else round(f.step_ms, 2),
        } for f, run in zip(figures, ranks)], hide_index=True)
        found = slowest_rank(figures)
        if found:
            st.warning(found[1], icon="🐢")
        else:
            st.caption("No rank holds the others back: their rates are within 5% of the median.")


def render() -> None:
    store = get_jobs().store
    st.title("Training jobs")
    st.caption("Add one line to your training script, `loader = watch(loader, name=\"train\")` "
               "(`from engine import watch`), and its loaders appear here while it trains.")
    store.mark_lost_runs()
    runs = [run for run in store.list_runs(500) if run.kind == "watch"]
    st.fragment(_watch_for_changes, run_every=WATCH_S)(store.statuses("watch"))
    if not runs:
        st.info("No watched jobs yet. Try `python examples/train_watched.py`.")
        return
    _table(runs)
    _ranks_view(runs)
    ids = [run.id for run in runs]
    running = [run.id for run in runs if run.status == "running"]
    labels = {run.id: _label(run) for run in runs}
    chosen = st.selectbox("Run", ids, index=ids.index(running[0]) if running else 0,
                          format_func=labels.get, key="watched_run")
    is_running = next(run for run in runs if run.id == chosen).status == "running"
    st.fragment(_run_view, run_every=REFRESH_S if is_running else None)(chosen)
