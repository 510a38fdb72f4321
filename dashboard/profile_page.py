"""A first page: profile a dataset module once and show what was measured.

The full live dashboard (streaming charts, tuning, apply) replaces this page; until then it is
an honest front door to the engine: every number shown comes from a real run.
"""

from __future__ import annotations

import os

import streamlit as st

from engine import LoaderConfig, RunRequest, RunStore, run_to_completion

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_TARGET = os.path.join("examples", "cpu_bound.py")


def _metric(label: str, value, fmt: str) -> None:
    st.metric(label, "n/a" if value is None else format(value, fmt))


def render() -> None:
    st.title("DataLoader Tuner")
    st.caption("Runs your Dataset in a real DataLoader in a background process and measures it. "
               "This dashboard executes the module you point it at: it listens on 127.0.0.1 only.")
    target = st.text_input("Dataset module", value=DEMO_TARGET,
                           help="path/to/data.py[:attr] or pkg.module[:attr]")
    cols = st.columns(3)
    num_workers = cols[0].number_input("num_workers", min_value=0, max_value=64, value=2)
    seconds = cols[1].number_input("seconds", min_value=1.0, max_value=60.0, value=4.0)
    step_ms = cols[2].number_input("simulated step (ms, 0 = module's train_step or none)",
                                   min_value=0.0, value=0.0)
    if not st.button("Profile"):
        st.info("Press Profile to measure the dataset above. The live view, the tuner and "
                "before/after verification are on their way to this page; the CLI has the "
                "tuner today: python -m engine tune TARGET.")
        return
    request = RunRequest(target=target, config=LoaderConfig(num_workers=int(num_workers)),
                         seconds=float(seconds), step_ms=float(step_ms) or None)
    with st.spinner("Running the loader..."):
        handle = run_to_completion(request, RunStore())
    doc = handle.live.summary(handle.state.value)
    if doc["status"] == "error":
        st.error(doc["error"]["message"])
        if doc["error"].get("details"):
            with st.expander("Details"):
                st.code(doc["error"]["details"])
        return
    st.success(f"Measured {doc['batches']} batches in {doc['seconds']:.1f} s: {doc['snippet']}")
    cols = st.columns(4)
    with cols[0]:
        _metric("samples/s", doc["samples_per_s"], ".1f")
    with cols[1]:
        _metric("batches/s", doc["batches_per_s"], ".1f")
    with cols[2]:
        _metric("p50 batch wait (ms)", doc["batch_latency_ms"]["p50"], ".2f")
    with cols[3]:
        _metric("p95 batch wait (ms)", doc["batch_latency_ms"]["p95"], ".2f")
    if doc["consumer_idle_frac"] is not None:
        st.write(f"Consumer idle: {doc['consumer_idle_frac']:.1%} ({doc['input_bound']})")
    st.dataframe(doc["workers"])
    if doc["not_measured"]:
        st.warning(f"GPU: not measured: {doc['not_measured']}.")
    for warning in doc["warnings"]:
        st.warning(f"[{warning['code']}] {warning['message']}")
