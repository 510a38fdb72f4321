"""A result in words: the CLI's text, and the phrases the pages share with it."""

from __future__ import annotations

import os
from typing import Any, Sequence

from dataloader_tuner.analyse.diagnostic import seconds_text
from dataloader_tuner.analyse.metrics import LOOP_TIME
from dataloader_tuner.analyse.results import ProfileResult


def fmt(value: float | None, spec: str = ".1f", unit: str = "") -> str:
    """A figure, or "n/a" where it was not measured (the CLI's text and the dashboard's)."""
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def profile_text(result: ProfileResult) -> str:
    """A profile run as the CLI prints it, in a few lines."""
    if result.failed:
        lines = [f"ERROR: {result.error_message}"]
        if result.batches:
            lines.append(f"(after {result.batches} batches)")
        return "\n".join(lines)
    lat = result.batch_latency_ms or {}
    lines = [
        f"{result.snippet or ''}",
        f"status: {result.status}   {result.batches} batches in {result.seconds:.1f} s "
        f"({result.epochs} epoch(s), {result.warmup_batches} warm-up)",
        f"throughput: {fmt(result.samples_per_s)} samples/s, "
        f"{fmt(result.batches_per_s)} batches/s (steady state)",
        f"batch wait: p50 {fmt(lat.get('p50'), '.2f', ' ms')}, "
        f"p95 {fmt(lat.get('p95'), '.2f', ' ms')}, max {fmt(lat.get('max'), '.2f', ' ms')}",
    ]
    if result.counting:
        lines.append(counting_text(result.counting))
    if result.input_wait is not None:
        wait = result.input_wait
        lines.append(f"input wait: {wait['share']:.1%} of the loop's time "
                     f"({fmt(wait['waited_s'], '.1f', ' s')} of {fmt(wait['loop_s'], '.1f', ' s')}:"
                     f" {LOOP_TIME}), epoch start-ups included ({result.input_bound})")
        startup = startup_text(result.input_wait)
        if startup:
            lines.append(f"epoch start-up: {startup}")
    if result.consumer_idle_frac is not None:
        lines.append(f"steady state: the loop waited {result.consumer_idle_frac * 100:.1f}% of "
                     f"its time after the first {result.warmup_batches} batch(es)")
    for w in result.workers:
        lines.append(
            f"  worker {w['id']} pid {w['pid']}: busy {fmt((w['busy_frac'] or 0) * 100, '.0f', '%')}, "
            f"cpu {fmt(w['cpu_percent'], '.0f', '%')}, rss {fmt(w['rss_mb'], '.0f', ' MB')}, "
            f"{w['batches']} batches"
        )
    lines += where_time_goes_text(result)
    lines += ceiling_text(result.ceiling, result.what_if, result.fixes)[1:]  # (no blank line)
    if result.not_measured:
        lines.append(f"GPU: not measured: {result.not_measured}.")
    elif result.transfer:
        lines.append(f"host-to-device copy: p50 "
                     f"{fmt(result.transfer['copy_ms']['p50'], '.3f', ' ms')}")
    for d in result.warnings:
        lines.append(f"{d.severity} [{d.code}]: {d.message}")
        if d.fix:
            lines += ["    fix: " + line for line in d.fix.splitlines()]
        if d.evidence.get("stack"):
            lines += ["    " + line for line in d.evidence["stack"].splitlines()]
    return "\n".join(lines)


TOP_STAGES, TOP_FUNCTIONS_SHOWN = 6, 5


def where_time_goes_text(result: ProfileResult) -> list[str]:
    """The loader's work by stage and its top functions, as sampled inside its processes
    (analyse/hotspots.py); or why there are no shares to show."""
    return stacks_text(result.stacks_sampled, result.stages, result.hotspots)


WHAT_IFS_SHOWN = 5


def _fix_gain(fix: dict[str, Any], now: float | None) -> str:
    """"1.30x  " predicted, "3.10x measured  " where the tune measured the fix."""
    if fix.get("measured_samples_per_s") and now:
        return f"{fix['measured_samples_per_s'] / now:.2f}x measured  "
    return f"{fix['predicted_gain']:.2f}x  " if fix["predicted_gain"] else ""


def ceiling_text(ceiling: dict[str, Any] | None, what_if: Sequence[dict[str, Any]],
                 fixes: Sequence[dict[str, Any]] = ()) -> list[str]:
    """The ceiling's sentence, the changes that would raise it most (analyse/ceiling.py) and
    the fixes named for the stages found (fixes.py): predictions, each said as one."""
    if not ceiling:
        return []
    lines = ["", ceiling["sentence"]]
    now = ceiling.get("measured_samples_per_s")
    for w in what_if:
        if w["measured_samples_per_s"] is not None and now:
            predicted = w["predicted_samples_per_s"]
            noise = w.get("measured_uncertainty_pct")
            lines.append(f"measured: {w['change']}: {w['measured_samples_per_s']:,.0f} samples/s"
                         + (f" ±{noise:.0f}%" if noise is not None else "")
                         + f", {w['measured_samples_per_s'] / now:.2f}x the pick's"
                         + (f" (predicted ~{predicted:,.0f})" if predicted else "")
                         + (f"; {w['caveat']}" if w.get("caveat") else ""))
    raising = [w for w in what_if if w["predicted_gain"] > 1.02
               and w["measured_samples_per_s"] is None][:WHAT_IFS_SHOWN]
    if raising:
        lines.append("what would raise it (predicted from the cost model and the profile, "
                     "not measured):")
        lines += [f"  {w['predicted_gain']:.2f}x  {w['change']}: "
                  f"~{w['predicted_samples_per_s']:,.0f} samples/s, then "
                  f"{w['then_binding'].replace('_', ' ')} binds" for w in raising]
    if fixes:
        lines.append("fixes to try (predicted, unless said measured):")
        lines += ["  " + _fix_gain(f, now) + f"{f['fix']} ({f['stage']}): {f['how']}"
                  for f in fixes]
    return lines


def sampled_basis(seen: dict[str, Any]) -> str:
    """What a profile rests on and what sampling it cost (the head of hotspots.py's merged stacks)."""
    cost = seen.get("sampling_share")  # (runs saved before it was kept have none)
    return (f"{seen['looks']} looks over {seen['seconds']:.1f} s of work in "
            f"{seen['processes']} process(es)"
            + (f"; sampling took {cost:.2%} of it" if cost is not None else ""))


def stacks_text(seen: dict[str, Any] | None, stages: Sequence[dict[str, Any]],
                hotspots: Sequence[dict[str, Any]]) -> list[str]:
    """``where_time_goes_text`` from its parts (a tune keeps them in one document)."""
    if not seen:
        return []
    basis = sampled_basis(seen)
    if not seen.get("enough") or not stages:
        return [f"where the time goes: too few samples to tell ({basis})"]
    shares = ", ".join(f"{s['stage']} {s['share']:.0%}"
                       + (f" (off CPU {s['share'] - s['cpu_share']:.0%})"
                          if s["share"] - s["cpu_share"] >= 0.05 else "")
                       for s in stages[:TOP_STAGES])
    lines = [f"where the time goes ({basis}): {shares}"]
    for h in hotspots[:TOP_FUNCTIONS_SHOWN]:
        lines.append(f"  {h['total_share']:5.1%} total, {h['self_share']:5.1%} self  "
                     f"{h['function']} ({os.path.basename(h['file'])}:{h['line']}) [{h['stage']}]")
    return lines


def counting_text(counting: dict[str, Any]) -> str:
    """"samples counted: exact: ...; making timed on ...; CPU time and bytes read on ...",
    and how rows were kept where batches came in windows."""
    text = (f"samples counted: {counting['samples']}; making timed on "
            f"{counting.get('making_timed_on', 'every batch')}; CPU time and bytes read on "
            f"{counting.get('cpu_time_and_bytes_read_on', 'every batch')}")
    windows = counting.get("windows")
    return f"{text}; {windows_text(windows)}" if windows else text


def windows_text(windows: dict[str, Any]) -> str:
    """What a run's rows are where batches came in windows (NOTE [ Windows for fast loaders ])."""
    return (f"batches came at {fmt(windows['from_batches_per_s'], ',.0f')} a second, beyond "
            f"{fmt(windows['above_batches_per_s'], ',.0f')}: they are counted in "
            f"{windows['window_s']:g} s windows ({windows['windows']:,} of them; counts, samples "
            f"and times exact, percentiles within ~9%), and a row is kept for one batch in "
            f"{windows['keep_every']}, each epoch's first, each timed one and each window's "
            f"slowest ({windows['rows_kept']:,} rows): a row is one batch, not a window")


def startup_text(wait: dict[str, Any]) -> str | None:
    """"12.0% of the loop's time; 3 start(s): 0.40 s the first, 0.38 s each later (median)",
    or None when no epoch started among the batches."""
    starts = wait.get("epochs_started") or 0
    if not starts:
        return None
    later = wait.get("startup_later_median_s")
    each = (f"{seconds_text(wait['startup_first_s'])} the first, {seconds_text(later)} each "
            "later (median)" if later is not None else seconds_text(wait["startup_first_s"]))
    return f"{wait['startup_share']:.1%} of the loop's time; {starts} start(s): {each}"


def speedup_text(baseline: dict[str, Any]) -> str:
    """``1.84x ±6%``, or the reason no speedup is claimed."""
    if baseline.get("speedup") is None:
        return baseline.get("speedup_note") or "no speedup claimed"
    pct = baseline.get("speedup_pct")
    note = baseline.get("speedup_note")
    return (f"{baseline['speedup']:.2f}x" + (f" ±{pct:.0f}%" if pct is not None else "")
            + (f" ({note})" if note else ""))
