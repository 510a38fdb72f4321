"""Training jobs watched with ``dataloader_tuner.watch(loader)``: the runs other processes write
into the history, listed by job and followed live in the same view as the engine's own runs."""

from __future__ import annotations

import time

import streamlit as st

from dataloader_tuner import (JobView, LiveRun, RankSummary, StoredRun, job_view,
                    summary_from_batches, window_figures)

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


RATE_WINDOW_BATCHES = 500  # a running run's samples/s in the table: its latest batches


def _rate(run: StoredRun) -> float | None:
    """The result's samples/s; while the run goes (its result comes at its end), the rate of
    its latest batches."""
    rate = run.samples_per_s
    if rate is None and run.status == "running":
        rate = window_figures(get_jobs().store.batches(run.id, RATE_WINDOW_BATCHES))[
            "samples_per_s"]
    return None if rate is None else round(rate, 1)


def _table(runs: list[StoredRun]) -> None:
    st.dataframe([{
        "run": run.id, "loader": run.label, "status": run.status, "job": _job_of(run),
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started_at)),
        "samples/s": _rate(run),
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
                  disabled=requested, on_click=_request_tune, args=(run,),
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


def _request_tune(run: StoredRun) -> None:
    """A torchrun job's loader is tuned by node, its ranks together (local rank 0 leads): every
    rank of the job in this history is asked."""
    store = get_jobs().store
    ranks = [other.id for other in store.list_runs(500)
             if run.rank and other.rank and other.status == "running"
             and other.rank["job_id"] == run.rank["job_id"] and other.label == run.label]
    for run_id in ranks or [run.id]:
        store.request_tune(run_id)


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
RANKS_REFRESH_S = 2.0  # as often as the ranks report
MEMORY_TREND_S = 300.0  # a rank's memory trend: its reports of the last minutes


def _jobs_of(runs: list[StoredRun]) -> dict[tuple, list[StoredRun]]:
    """Watched runs of torchrun jobs, by (job, loader)."""
    jobs: dict[tuple, list[StoredRun]] = {}
    for run in runs:
        if run.rank:
            jobs.setdefault((run.rank["job_id"], run.label), []).append(run)
    return jobs


def _job_view(ranks: list[StoredRun]) -> tuple[JobView, str] | None:
    """The job from rank 0's gathered reports (every node) or, without them, from the runs
    of its ranks in this history (the ranks on this machine)."""
    store = get_jobs().store
    gatherer, latest = None, []
    for run in ranks:
        if run.rank["rank"] == 0:
            latest = store.rank_reports(run.id)
            if latest:
                gatherer = run
                break
    if gatherer is not None:
        collecting = gatherer.status == "running"
        # Once rank 0 has stopped: the job as it last saw it (it gathers after its own end).
        now = time.time() if collecting else max(
            [gatherer.ended_at or gatherer.heartbeat_at or 0.0] + [at for at, _ in latest])
        series: dict[int, list[RankSummary]] = {}
        for _, report in store.rank_reports(gatherer.id, latest=False,
                                            since=now - MEMORY_TREND_S):
            series.setdefault(report.rank, []).append(report)
        return (job_view(latest, now, collecting, series),
                f"Gathered by rank 0 (run #{gatherer.id}) through the job's own "
                "torch.distributed store: every rank reports every 2 s, on every node.")
    if len(ranks) < 2:
        return None
    latest = [(run.heartbeat_at or run.started_at, summary_from_batches(
        run.label or "loader", run.rank, run.host or "", run.pid or 0, run.status,
        (run.ended_at or run.heartbeat_at or run.started_at) - run.started_at,
        store.batches(run.id, RANK_WINDOW_BATCHES))) for run in ranks]
    return (job_view(latest, time.time(), any(run.status == "running" for run in ranks)),
            "From each rank's own run in this history (the ranks on this machine; rank 0 "
            "gathers every node's once the job's store is reachable).")


def _pct(value: float | None) -> float | None:
    return None if value is None else round(100 * value, 1)


def _ranks_view() -> None:
    """Each torchrun job's loaders, rank by rank and node by node, and the rank that holds the
    others back (re-read every RANKS_REFRESH_S while a rank runs)."""
    runs = [run for run in get_jobs().store.list_runs(500) if run.kind == "watch"]
    for (job_id, label), ranks in _jobs_of(runs).items():
        found = _job_view(ranks)
        if found is None:
            continue
        view, source = found
        st.markdown(f"**Job `{job_id}`, loader {label}: {len(view.ranks)} of "
                    f"{ranks[0].rank['world_size']} ranks, {len(view.nodes)} node(s)**")
        st.caption(source)
        st.dataframe([{
            "rank": r.summary.rank, "node": r.summary.node, "state": r.state,
            "samples/s": None if r.summary.samples_per_s is None
            else round(r.summary.samples_per_s, 1),
            "input wait %": _pct(r.summary.input_wait_frac),
            "step ms": None if r.summary.step_ms is None else round(r.summary.step_ms, 2),
            "workers busy %": _pct(r.summary.worker_busy_frac),
            "memory MB": r.summary.memory_mb, "batches": r.summary.batches, "note": r.note,
        } for r in view.ranks], hide_index=True)
        if view.straggler:
            st.warning(view.straggler[1], icon="🐢")
        else:
            st.caption("No rank holds the others back: no rank's input wait stands out, and "
                       "their rates are within 5% of the median.")
        if any(node.cpu_pct is not None for node in view.nodes):
            st.dataframe([{
                "node": n.node, "host": n.host, "ranks": ", ".join(map(str, n.ranks)),
                "CPU %": n.cpu_pct, "CPUs": n.cpus,
                "/dev/shm used MB": n.shm_used_mb, "/dev/shm size MB": n.shm_total_mb,
                "loaders' memory MB": n.memory_mb,
            } for n in view.nodes], hide_index=True)
            st.caption("Per node, as its ranks last saw it: CPU of the whole node, /dev/shm "
                       "(where worker batches travel to the training process), and the RSS of "
                       "its ranks' loaders (main processes and workers; shared pages counted "
                       "in each).")


def render() -> None:
    store = get_jobs().store
    st.title("Training jobs")
    st.caption("Add one line to your training script, `loader = watch(loader, name=\"train\")` "
               "(`from dataloader_tuner import watch`), and its loaders appear here while it trains.")
    store.mark_lost_runs()
    runs = [run for run in store.list_runs(500) if run.kind == "watch"]
    st.fragment(_watch_for_changes, run_every=WATCH_S)(store.statuses("watch"))
    if not runs:
        st.info("No watched jobs yet. Try `python examples/train_watched.py`.")
        return
    _table(runs)
    ranked_live = any(run.rank and run.status == "running" for run in runs)
    st.fragment(_ranks_view, run_every=RANKS_REFRESH_S if ranked_live else None)()
    ids = [run.id for run in runs]
    running = [run.id for run in runs if run.status == "running"]
    labels = {run.id: _label(run) for run in runs}
    chosen = st.selectbox("Run", ids, index=ids.index(running[0]) if running else 0,
                          format_func=labels.get, key="watched_run")
    is_running = next(run for run in runs if run.id == chosen).status == "running"
    st.fragment(_run_view, run_every=REFRESH_S if is_running else None)(chosen)
