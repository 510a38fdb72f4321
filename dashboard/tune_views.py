"""The Live page's tune (live_page.py draws them): its progress while it runs, its
recommendation once it is done, and what an Apply measured, before against after."""

from __future__ import annotations

import json
import time
from typing import Callable

import streamlit as st

from dataloader_tuner import settings_file
from dataloader_tuner.ui import RunHandle, check_claim, speedup_text

from . import charts, views
from .jobs import Jobs


def applied_block(jobs: Jobs) -> None:
    verification = jobs.verification
    if jobs.applied is None or verification is None:
        return
    result = verification.result()
    if verification.state == "running":
        st.info(f"**Applied.** Verifying: measuring the old and the new settings, run "
                f"{len(verification.runs)} of {verification.total_runs} (A B A B).", icon="⏱️")
        return
    if verification.state == "error":
        views.error_card({"message": f"Applied, but verification failed: {verification.error}"})
        return
    if verification.state == "stopped":
        st.warning("**Applied**, but the verification was stopped before it finished.")
        return
    before, after = result.before, result.after
    speedup = result.speedup
    st.caption(f"Applied to `{jobs.applied['target']}`: "
               + ", ".join(f"{k}={v!r}" for k, v in jobs.applied["after"].items()))
    if before.config == after.config:
        st.caption("The recommended settings are the ones you already had: this measures the "
                   "run-to-run noise of this machine.")
    idle = ""
    if before.consumer_idle_frac is not None and after.consumer_idle_frac is not None:
        idle = (f" Consumer idle {before.consumer_idle_frac * 100:.1f} % before, "
                f"{after.consumer_idle_frac * 100:.1f} % after.")
    st.success(f"**Applied.** Measured {views.fmt(after.samples_per_s)} samples/s with the new "
               f"settings vs {views.fmt(before.samples_per_s)} before: "
               f"**{views.fmt(speedup, '.2f', 'x')}** (median of {result.rounds} runs each, "
               f"interleaved).{idle}", icon="✅")
    tuned = (jobs.tune_result(jobs.tune) if jobs.tune is not None and jobs.tune.state.done
             else None)
    verdict = check_claim(tuned.baseline if tuned is not None else None, speedup)
    if verdict:
        st.caption(verdict)
    cols = st.columns(2)
    for col, (arm, data) in zip(cols, (("before", before), ("after", after))):
        arm_idle = data.consumer_idle_frac
        col.markdown(f"**{arm.capitalize()}**: `{data.snippet}`")
        col.metric(f"{arm}: samples/s", views.fmt(data.samples_per_s))
        col.caption("rounds: " + ", ".join(f"{r:.1f}" for r in data.samples_per_s_rounds)
                    + ("" if arm_idle is None else f"; consumer idle {arm_idle * 100:.1f} %")
                    + f"; saved as runs {', '.join(map(str, data.run_ids))}")
    runs = [(f"{arm} (run {h.run_id})", list(h.live.batches)) for arm, h in verification.runs[-2:]]
    st.plotly_chart(charts.compare_throughput_figure(
        runs, [h.live.windows for _, h in verification.runs[-2:]]), key="applied-compare")


def recommendation_block(jobs: Jobs, apply: Callable[[Jobs, dict], None]) -> None:
    """``apply``: the Apply button's callback (the page's: it owns the controls)."""
    tune = jobs.tune
    if tune is None or not tune.state.done:
        return
    tuned = jobs.tune_result(tune)
    st.subheader("Recommendation")
    if tuned.failed:
        views.error_card(tuned.error or {"message": "The tune failed."}, tune.output_tail())
        return
    if not tuned.recommended:
        st.warning("Tuning was stopped before it reached a recommendation.")
        return
    rec = tuned.recommended
    st.plotly_chart(charts.tune_figure([t.to_dict() for t in tuned.trials],
                                       rec.get("num_workers")),
                    key="tune-final")
    base = tuned.baseline or {}
    noise = tuned.uncertainty_pct
    with st.container(border=True):
        st.markdown(
            f"**Expected {views.fmt(tuned.expected_samples_per_s)} samples/s**"
            + (f" (±{noise:.0f} %)" if noise is not None else "")
            + (f": **{speedup_text(base)}** over {base.get('source')} "
               f"({views.fmt(base.get('samples_per_s'))} samples/s measured)"
               if base.get("speedup") else ""))
        if base.get("speedup") is None and base.get("speedup_note"):
            st.caption(f"Baseline ({base.get('source')}): "
                       f"{views.fmt(base.get('samples_per_s'))} samples/s; "
                       f"{base['speedup_note']}.")
        elif base.get("claimed_from"):
            st.caption(f"Claimed from {base['claimed_from']}, so a store or page cache that "
                       "warmed while tuning cannot inflate it.")
        st.code(tuned.snippet, language="python")
        for reason in tuned.reasons:
            st.markdown(f"- {reason}")
        views.warnings_list(tuned.warnings)
        views.ceiling_view(tuned.ceiling, tuned.what_if, tuned.fixes, key="tune")
        if tuned.stacks:  # (none where the trials' work was too quick to be seen)
            with st.expander("Where the trials' time went"):
                views.where_time_goes(tuned.stacks, key="tune",
                                      name=f"tune of {tune.request.target}, all trials")
        left, right = st.columns(2)
        left.button("Apply recommended settings", type="primary", on_click=apply,
                    args=(jobs, rec), disabled=jobs.busy())
        right.download_button("Download settings file",
                              json.dumps(settings_file(tuned), indent=2),
                              file_name="dataloader_settings.json", mime="application/json")
    announced, floor = tuned.announced(), tuned.against_floor()
    st.caption(f"Tuned in {tuned.tuning_seconds:.1f} s with {len(tuned.trials)} measured trials"
               + (f" (announced as it started: {announced})" if announced else "")
               + (f", {floor}" if floor else "")
               + ". Load the file with `dataloader_tuner.load_settings(path, worker_init_fn=<yours, if any>)`.")


def tune_progress(tune: RunHandle) -> None:
    plan = tune.live.plan
    elapsed = time.monotonic() - (tune.started_at or time.monotonic())
    trials = [t.to_dict() for t in tune.live.trials]
    last = tune.live.trials[-1] if trials else None
    # the plan's estimate, or the user's limit where that ends it first (a plan that waits
    # for the probes says no estimate yet: NOTE [ Said after the probes ], tune/plan.py)
    expected = (min(plan.estimated_s, plan.budget_s or plan.estimated_s)
                if plan is not None and not plan.probing else tune.request.budget_s)
    of = f" of about {expected:.0f} s" if expected else ""
    text = (f"Tuning: {len(trials)} trials measured, {elapsed:.0f} s{of}"
            + (f"; last: num_workers={last.num_workers} gave "
               f"{views.fmt(last.samples_per_s)} samples/s" if last else "; loading the dataset"))
    if plan is not None:
        st.caption(f"The plan: {plan.text()}.")
    st.progress(min(elapsed / max(expected or elapsed * 2, 1.0), 0.99), text=text)
    if trials:
        st.plotly_chart(charts.tune_figure(trials), key="tune-live")
