"""The main page: point at a dataset module, run it live, tune it, apply the result.

Button actions run as ``on_click`` callbacks (before the script), so what the page draws
already reflects them. The live view is a fragment that refreshes every second only while a
job runs; when the job ends it re-runs the whole page once, which draws the final state
(recommendation card, "Applied" comparison) and stops the refresh.
"""

from __future__ import annotations

import json
import os

import streamlit as st

from dataloader_tuner import ConfigError
from dataloader_tuner.ui import (DEFAULT_BATCH_SIZE, DEFAULT_BUDGET_S, DEFAULT_MAX_WORKERS,
                                 DEFAULT_SECONDS, DEFAULT_TIMEOUT_S, BatchLog, Inspection,
                                 RunHandle, shm_check)

from . import views
from .jobs import (Jobs, controls_from_settings, live_view, request_from_controls,
                   settings_from_controls, tune_request,
                   verification_requests)
from .shared import get_jobs
from .tune_views import applied_block, recommendation_block, tune_progress

DEMO_TARGET = "dataloader_tuner.demo"  # ships with the package: the page opens on it anywhere
AUTOSTART_ENV = "DLTUNER_AUTOSTART"  # "0": do not start the demo run on first open (tests)
REFRESH_S = 1.0
WATCH_S = 2.0  # an idle tab looks this often for a job started elsewhere (another tab)

CONTROL_DEFAULTS = {
    "batch_size": DEFAULT_BATCH_SIZE, "self_batching": False, "batch_sampler": False, "num_workers": 0,
    "pin_memory": False, "prefetch_factor": 2, "persistent_workers": False, "in_order": True,
    "one_thread": False, "keep_freed": False, "consumer": "train_step", "step_ms": 10.0, "seconds": DEFAULT_SECONDS,
    "timeout_s": DEFAULT_TIMEOUT_S, "budget_s": DEFAULT_BUDGET_S,
    "max_workers": DEFAULT_MAX_WORKERS, "local_world_size": 1, "keep_order": False,
    "verify_seconds": 5.0,
}
CONSUMERS = {
    "train_step": "the module's train_step",
    "simulated": "a simulated GPU step",
    "none": "none (the loader alone)",
}


def controls() -> dict:
    return {name: st.session_state[f"ctl_{name}"] for name in CONTROL_DEFAULTS}


def _init_state(jobs: Jobs) -> None:
    """A new tab opens on the server's latest job (its target and settings), so what it shows
    next to that job's results is that job's, not the demo's defaults."""
    if "target" not in st.session_state and jobs.last_request is not None:
        request = jobs.last_request
        st.session_state.target = st.session_state.synced_target = request.target
        _set_controls(controls_from_settings(request.settings))
        st.session_state.ctl_consumer = ("train_step" if request.step_ms is None else
                                         "none" if request.step_ms == 0 else "simulated")
        if request.step_ms:
            st.session_state.ctl_step_ms = float(request.step_ms)
    st.session_state.setdefault("target", DEMO_TARGET)
    for name, value in CONTROL_DEFAULTS.items():
        st.session_state.setdefault(f"ctl_{name}", value)


# -- actions (on_click callbacks) ------------------------------------------------------------

def _start(jobs: Jobs) -> None:
    jobs.start_run(request_from_controls(st.session_state.target.strip(), controls()))


def _tune(jobs: Jobs) -> None:
    jobs.start_tune(tune_request(st.session_state.target.strip(), controls()))


def _stop(jobs: Jobs) -> None:
    jobs.stop_in_background()  # the page does not wait for the stop (up to 2 s)


def _apply(jobs: Jobs, recommended: dict) -> None:
    """Put the recommendation into the controls and verify it against the settings it replaces."""
    if jobs.tune_request is None:  # the button shows only under a tune's recommendation
        return
    before, after = verification_requests(jobs.tune_request, recommended,
                                          float(st.session_state.ctl_verify_seconds))
    _set_controls(controls_from_settings(after.settings))
    jobs.apply(before, after)


def _set_controls(values: dict) -> None:
    for name, value in values.items():
        st.session_state[f"ctl_{name}"] = value


# -- page parts --------------------------------------------------------------------------------

def _dataset_card(info: Inspection) -> None:
    ds = info.dataset
    if ds is None:
        views.error_card(info.error or {"message": "The module could not be checked."})
        return
    length = "unknown length (IterableDataset)" if ds.length is None else f"{ds.length} samples"
    sample = ""
    if ds.sample is not None:
        size = f", {ds.sample_bytes / 1024:.1f} KiB" if ds.sample_bytes else ""
        sample = f"; sample 0: `{json.dumps(ds.sample)}`{size}"
    extras = [name for flag, name in (
        (ds.has_train_step, "train_step"), (ds.has_collate_fn, "collate_fn"),
        (ds.has_sampler, "a sampler"),
        (ds.defines_batch_size, f"batch_size={ds.module_batch_size}"),
        (ds.has_dataloader_kwargs, "dataloader_kwargs (the controls start from them)"))
        if flag]
    st.success(f"Found **{ds.class_name}** ({ds.kind}-style, via `{ds.found_as}`): "
               f"{length}{sample}" + (f". Module also defines: {', '.join(extras)}." if extras
                                      else "."), icon="✅")


def _shm_before_start(info: Inspection) -> None:
    """Before Start: would the settings on the page keep more batches in flight than /dev/shm
    holds (sample 0's bytes times the batch size)?"""
    if not info.ok or not info.system:
        return
    try:
        settings = settings_from_controls(controls())
    except ConfigError:
        return  # Start says what is wrong with them
    views.warnings_list(shm_check(settings, info.dataset, info.system.get("shm")))


def _sync_controls(info: Inspection) -> list[str]:
    """Follow the module: when a new target is checked, the controls show its own settings
    (batch_size, dataloader_kwargs), so "current settings" mean the same here and in the CLI."""
    ds = info.dataset
    if ds is None:
        return list(CONSUMERS)
    if st.session_state.get("synced_target") != ds.target:
        st.session_state.synced_target = ds.target
        _set_controls(controls_from_settings(info.config or {}))
        st.session_state.ctl_consumer = "train_step" if ds.has_train_step else "none"
    options = [c for c in CONSUMERS if c != "train_step" or ds.has_train_step]
    if st.session_state.ctl_consumer not in options:
        st.session_state.ctl_consumer = options[0]
    return options


def _sidebar(consumer_options: list[str]) -> None:
    bar = st.sidebar
    bar.header("Loader settings")
    own_batches = st.session_state.ctl_batch_sampler
    if own_batches:
        bar.caption("The module's batch_sampler makes the batches: no batch_size here.")
    bar.checkbox("batch_size=None (the dataset yields whole batches)", key="ctl_self_batching",
                 help="As WebDataset pipelines do: each item is already a batch.",
                 disabled=own_batches)
    bar.number_input("batch_size", min_value=1, max_value=1 << 20, key="ctl_batch_size",
                     disabled=st.session_state.ctl_self_batching or own_batches)
    bar.number_input("num_workers", min_value=0, max_value=512, key="ctl_num_workers")
    bar.checkbox("pin_memory", key="ctl_pin_memory")
    no_workers = st.session_state.ctl_num_workers == 0
    bar.number_input("prefetch_factor", min_value=1, max_value=64, key="ctl_prefetch_factor",
                     disabled=no_workers, help="Batches each worker keeps ready; needs workers.")
    bar.checkbox("persistent_workers", key="ctl_persistent_workers", disabled=no_workers,
                 help="Keep workers alive between epochs; needs workers.")
    bar.checkbox("in_order", key="ctl_in_order", disabled=no_workers,
                 help="Batches in the sampler's order (DataLoader's default). Off: each batch "
                      "as soon as its worker made it, so a slow one is overtaken (torch 2.6+).")
    bar.checkbox("One thread per pool in each worker", key="ctl_one_thread", disabled=no_workers,
                 help="worker_init_fn=dataloader_tuner.LimitThreads(): torch's, BLAS's, "
                      "OpenMP's and OpenCV's thread pools to one thread in each worker, so "
                      "workers x threads do not outnumber the cores.")
    bar.checkbox("Each worker keeps the memory it frees", key="ctl_keep_freed",
                 disabled=no_workers,
                 help="worker_init_fn=dataloader_tuner.KeepFreedMemory(): freed arrays stay in "
                      "the worker for its next batch instead of being faulted in again "
                      "(glibc's malloc thresholds; Linux).")
    bar.header("Consumer")
    bar.radio("What consumes each batch", consumer_options, key="ctl_consumer",
              format_func=CONSUMERS.get)
    bar.number_input("Simulated step (ms)", min_value=0.0, max_value=60000.0, key="ctl_step_ms",
                     disabled=st.session_state.ctl_consumer != "simulated")
    bar.header("Run")
    bar.number_input("Run length (s)", min_value=1.0, max_value=3600.0, key="ctl_seconds")
    bar.number_input("Fail if no batch for (s)", min_value=1.0, max_value=3600.0,
                     key="ctl_timeout_s")
    bar.header("Tuning")
    bar.number_input("Tuning time limit (s)", min_value=5.0, max_value=86400.0,
                     key="ctl_budget_s", placeholder="none: ~90 s aimed at",
                     help="Empty: the tune aims at ~90 s (more where batches are so slow "
                          "that the counts it must see need it), and says its time as it "
                          "starts. A limit is hard: the pick then says what it did not reach.")
    bar.number_input("Most workers to try", min_value=1, max_value=512, key="ctl_max_workers")
    bar.number_input("Ranks on this machine", min_value=1, max_value=64,
                     key="ctl_local_world_size",
                     help="A torchrun job's ranks per node (--nproc-per-node): every trial runs "
                          "this many loaders at once, so the pick is per rank under the "
                          "contention of all of them.")
    bar.checkbox("Keep batches in order", key="ctl_keep_order",
                 help="Your training needs batches in the sampler's order: the tuner never "
                      "tries in_order=False (which lets a slow batch be overtaken).")
    bar.number_input("Seconds per verification run", min_value=1.0, max_value=600.0,
                     key="ctl_verify_seconds",
                     help="Apply measures the old and the new settings twice each, A B A B.")


def _autostart(jobs: Jobs, info: Inspection) -> None:
    """The first open of a fresh server starts the demo, so something real runs at once."""
    if (os.environ.get(AUTOSTART_ENV, "1") != "0" and not jobs.started_any
            and info.ok and st.session_state.target == DEMO_TARGET):
        _start(jobs)


def _run_view(jobs: Jobs, handle: RunHandle) -> None:
    state = handle.state
    result = jobs.profile_result(handle)
    label = f" ({handle.request.label})" if handle.request.label else ""
    title = f"Run {handle.run_id}{label}: `{handle.request.target}`"
    if state.done:
        st.markdown(f"{title}: **{state.value}** after {result.seconds or 0:.1f} s")
    else:
        st.markdown(f"{title}: **{state.value}**, {handle.live.elapsed_s:.1f} s of "
                    f"{handle.request.seconds:g} s")
    if result.snippet:
        st.code(result.snippet, language="python")
    if result.failed and result.error:
        views.error_card(result.error, handle.output_tail())
    views.warnings_list(result.warnings)
    live = live_view(handle)
    if not live.batches:
        return
    views.headline(result)
    if live is not handle.live:
        whole = BatchLog(handle.live.batches, handle.live.windows).batches
        st.caption(f"While the run goes, figures and charts cover its last "
                   f"{BatchLog(live.batches, live.windows).batches:,} of {whole:,} batches; the "
                   "saved result covers all of them.")
    views.run_charts(result, list(live.batches), key="live", windows=live.windows)
    views.where_time_goes(views.sampled_of(result), key="live",
                          name=f"profile of {handle.request.target}")
    if state.done:  # (read from the whole run: said once it ended)
        views.ceiling_view(result.ceiling, result.what_if, result.fixes, key="live")
    with st.expander("Workers and the main process", expanded=False):
        views.workers_table(result)
    st.markdown("**System**")
    views.system_panel(result.system, handle.live.gpu_samples, live=not state.done)


def _live_view(jobs: Jobs) -> None:
    busy = jobs.busy()
    if st.session_state.get("live_was_busy") and not busy:
        st.session_state.live_was_busy = False
        st.rerun()  # the whole page once: final charts, recommendation, "Applied"
    st.session_state.live_was_busy = busy
    if jobs.verification is not None and jobs.verification.state == "running":
        st.caption(f"Verification run {len(jobs.verification.runs)} of "
                   f"{jobs.verification.total_runs}")
    if jobs.tune is not None and not jobs.tune.state.done:
        tune_progress(jobs.tune)
        return
    if jobs.run is None:
        st.info("No run yet. Press **Start** to run the loader with the settings on the left.")
        return
    _run_view(jobs, jobs.run)


def _watch_for_jobs(jobs: Jobs) -> None:
    """An idle tab: re-draw when a job starts elsewhere (another tab, a reload)."""
    if jobs.busy():
        st.rerun()


def render() -> None:
    jobs = get_jobs()
    _init_state(jobs)
    st.title("DataLoader Tuner")
    st.caption("Runs your Dataset in a real DataLoader in a background process and measures it. "
               "This dashboard executes the module you point it at; it listens on 127.0.0.1.")
    st.text_input("Dataset module", key="target",
                  help="path/to/data.py[:attr] or pkg.module[:attr]: a Dataset instance, a "
                       "Dataset class, or a function returning one")
    with st.spinner("Checking the module..."):
        info = jobs.inspect(st.session_state.target.strip())
    _dataset_card(info)
    _sidebar(_sync_controls(info))
    _shm_before_start(info)
    _autostart(jobs, info)
    ready = info.ok
    busy = jobs.busy()
    cols = st.columns([1, 1, 1, 6])
    cols[0].button("Start", type="primary", on_click=_start, args=(jobs,), disabled=not ready)
    cols[1].button("Stop", on_click=_stop, args=(jobs,), disabled=not busy)
    cols[2].button("Tune", on_click=_tune, args=(jobs,), disabled=not ready)
    applied_block(jobs)
    recommendation_block(jobs, _apply)
    st.subheader("Live view")
    st.fragment(_live_view, run_every=REFRESH_S if busy else None)(jobs)
    if not busy:
        st.fragment(_watch_for_jobs, run_every=WATCH_S)(jobs)
