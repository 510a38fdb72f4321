"""Training jobs watched with ``dataloader_tuner.watch(loader)``: the runs other processes write
into the history, listed by job and followed live in the same view as the engine's own runs."""

from __future__ import annotations

import functools
import time

import streamlit as st

from dataloader_tuner import ProfileResult, RunStore, StoredRun
from dataloader_tuner.ui import (Followed, InPlaceDecision, LiveRun, TrialRecord,
                                 settle_dead_runs, spends_most_in)

from . import job_board, views
from .shared import get_jobs

REFRESH_S = 1.0
LIVE_WINDOW_BATCHES = 5000  # the live figures cover the most recent batches (as the Live page)
# An ended run's charts cover at most its most recent batches (its figures are its saved
# result's, of all of them): a day's job has 1.7 million rows, ~10 s to read (0.17 s a 25,000)
ENDED_BATCHES_SHOWN = 50_000
RANKS_REFRESH_S = 2.0  # as often as the ranks report


def _table(board: job_board.Board) -> None:
    st.dataframe([{
        "run": run.id, "loader": run.label, "status": run.status, "job": job_board.job_of(run),
        "built by": run.framework or "the script",
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started_at)),
        "samples/s": _round(board.rates[run.id]),
    } for run in board.runs], hide_index=True)


@functools.lru_cache(maxsize=4)
def _ended(store: RunStore, run_id: int, status: str, ended_at: float | None,
           saved: bool) -> LiveRun:
    """A run that has ended, as the history has it: read once for all its redraws (it no
    longer changes; each rerun read a 25,000-batch run's rows and 500 stack events again,
    0.4 s of a 0.8 s page at 10,000 runs: bench/history_scale.py). Where its result was
    ``saved`` (its figures and its merged stacks), not its stacks, and its latest batches."""
    if not saved:
        return LiveRun.stored(store, run_id)
    return LiveRun.stored(store, run_id, ENDED_BATCHES_SHOWN, stacks=False)


def _running(store: RunStore, run_id: int) -> LiveRun:
    """A running run, followed across this tab's refreshes: each reads what was written since
    the last (``Followed``), not all its sampled stacks and resource samples again."""
    followed = st.session_state.get("followed_run")
    if followed is None or followed.run_id != run_id or followed.store is not store:
        followed = st.session_state.followed_run = Followed(store, run_id, LIVE_WINDOW_BATCHES)
    return followed.refresh()


def _run_view(run_id: int) -> None:
    """One watched run, re-read from the history on each refresh while it is running."""
    store = get_jobs().store
    run = store.get_run(run_id)
    if run is None:
        st.warning(f"Run {run_id} is no longer in the history.")
        return
    running = run.status == "running"
    live = (_running(store, run_id) if running
            else _ended(store, run_id, run.status, run.ended_at,
                        saved=isinstance(run.result, ProfileResult)))
    result = run.result if isinstance(run.result, ProfileResult) else live.profile_result(
        "ok" if run.status in ("running", "lost") else run.status)
    by = f" (built by {run.framework})" if run.framework else ""
    st.markdown(f"**{run.label or 'loader'}**{by} in `{job_board.job_of(run)}`: **{run.status}**, "
                f"{live.elapsed_s:.1f} s, {live.batches_seen():,} batches"
                + (" (the most recent)" if running else "")
                + (f" (charted: the most recent {len(live.batches):,})"
                   if not running and live.batches and live.batches[0].seq > 0 else ""))
    if run.status == "lost":
        st.warning("This job ended without a goodbye (killed, or crashed hard): shown up to "
                   "its last flush.", icon="⚠️")
    if run.error:
        views.error_card(run.error)
    if running:
        requested = store.tune_requested(run_id)
        st.button("Tune this job" if not requested else "Tuning requested", key=f"tune-{run_id}",
                  disabled=requested, on_click=_request_tune, args=(store, run),
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
    untimed = (result.counting or {}).get("workers")
    if untimed:  # its workers could not be probed: which part is not measured, and why
        st.caption(f"Not timed inside its workers: {untimed}.")
    views.run_charts(result, live.batches, key=f"watched-{run_id}", windows=live.windows)
    views.where_time_goes(views.sampled_of(result), key=f"watched-{run_id}",
                          name=f"watched {run.label or 'loader'} in {job_board.job_of(run)}")
    views.ceiling_view(result.ceiling, result.what_if, result.fixes, key=f"watched-{run_id}")
    with st.expander("Workers and the main process", expanded=False):
        views.workers_table(result)
    views.warnings_list(result.warnings)
    st.markdown("**System**")
    views.system_panel(result.system, live=running)


def _request_tune(store: RunStore, run: StoredRun) -> None:
    job_board.request_tune(store, run)


def _tuning_log(trials: list[TrialRecord]) -> None:
    """The in-place search's decisions, as the job logged them."""
    decisions = [t for t in trials if isinstance(t, InPlaceDecision)]
    if not decisions:
        return
    st.markdown("**Tuning in place**")
    st.dataframe([{
        "num_workers": d.num_workers,
        "samples/s": _round(d.samples_per_s),
        "±": None if d.rate_ci is None else f"{d.rate_ci:.0%}",
        "decision": d.verdict,
    } for d in decisions], hide_index=True)


WATCH_S = 2.0  # how often the page looks for jobs that started (or ended) since it was drawn


def _watch_for_changes(shown: dict[int, str]) -> None:
    """Re-draw the page when a watched run starts, or one shown changes status (a job that
    starts after the page was opened appears without a reload)."""
    if get_jobs().store.statuses("watch") != shown:
        st.rerun()


def _pct(value: float | None) -> float | None:
    return None if value is None else round(100 * value, 1)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _ranks_view() -> None:
    """Each torchrun job's loaders, rank by rank and node by node, and the rank that holds the
    others back (re-read every RANKS_REFRESH_S while a rank runs)."""
    store = get_jobs().store
    for job in job_board.job_views(store, job_board.read_board(store, live_rates=False)):
        (job_id, label), view = job.key, job.view
        st.markdown(f"**Job `{job_id}`, loader {label}: {len(view.ranks)} of "
                    f"{job.world_size} ranks, {len(view.nodes)} node(s)**")
        st.caption(job.source)
        st.dataframe([{
            "rank": r.summary.rank, "node": r.summary.node, "state": r.state,
            "samples/s": None if r.summary.samples_per_s is None
            else round(r.summary.samples_per_s, 1),
            "input wait %": _pct(r.summary.input_wait_frac),
            "step ms": None if r.summary.step_ms is None else round(r.summary.step_ms, 2),
            "workers busy %": _pct(r.summary.worker_busy_frac),
            "memory MB": r.summary.memory_mb, "batches": r.summary.batches,
            "loader's time goes": spends_most_in(r.summary), "note": r.note,
        } for r in view.ranks], hide_index=True)
        if view.stages:
            st.caption("Where all ranks' loaders' time goes (sampled in their workers, "
                       "weighted by each rank's work): " + ", ".join(
                           f"{stage} {share:.0%}" for stage, share in view.stages))
        if view.straggler:
            st.warning(view.straggler[1], icon="🐢")
        else:
            st.caption("No rank holds the others back: no rank's input wait stands out, and "
                       "their rates are within 5% of the median.")
        for node in view.nodes:
            warning = node.shm_warning()
            if warning:
                st.warning(warning, icon="⚠️")
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
    settle_dead_runs(store)  # NOTE [ Runs ended without a word ] (engine/run/settle.py)
    board = job_board.read_board(store)
    st.fragment(_watch_for_changes, run_every=WATCH_S)(store.statuses("watch"))
    if not board.runs:
        st.info("No watched jobs yet. Try `python examples/train_watched.py`.")
        return
    _table(board)
    ranked_live = any(run.rank and run.status == "running" for run in board.runs)
    st.fragment(_ranks_view, run_every=RANKS_REFRESH_S if ranked_live else None)()
    ids = [run.id for run in board.runs]
    labels = {run.id: job_board.run_label(run) for run in board.runs}
    chosen = st.selectbox("Run", ids, index=ids.index(board.shown_first() or ids[0]),
                          format_func=labels.__getitem__, key="watched_run")
    if chosen is None:  # only with no runs, which is returned above
        return
    is_running = next(run for run in board.runs if run.id == chosen).status == "running"
    st.fragment(_run_view, run_every=REFRESH_S if is_running else None)(chosen)
