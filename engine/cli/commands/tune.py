"""``tune``: search the loader settings and print (or save) the recommendation."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from dataloader_tuner.access import open_private
from dataloader_tuner import protocol
from dataloader_tuner.record.trials import TrialResult
from dataloader_tuner.analyse.text import ceiling_text, speedup_text, stacks_text
from dataloader_tuner.analyse.results import TuneResult
from dataloader_tuner.cli.args import (EXIT_OK, EXIT_RUN_FAILED, add_db, add_json,
                                       add_loader_target, add_run_limits, add_speedscope,
                                       positive_float, positive_int, print_json,
                                       settings_from_args, write_speedscope)
from dataloader_tuner.settings import settings_file
from dataloader_tuner.run.runner import RunRequest, run_to_completion
from dataloader_tuner.store import RunStore


NAME = "tune"
HELP = "find the best num_workers / pin_memory / prefetch settings"


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    add_loader_target(parser)
    parser.add_argument("--budget-s", type=positive_float, default=protocol.DEFAULT_BUDGET_S,
                        help="a hard limit on the tune's seconds, its end's claim included "
                             "(default: none; the tune aims at ~90 s, more where batches are "
                             "slow, and says up front how long it takes)")
    parser.add_argument("--max-workers", type=positive_int, default=protocol.DEFAULT_MAX_WORKERS,
                        help="never try more workers than this (default %(default)d)")
    parser.add_argument("--local-world-size", type=positive_int, default=1,
                        help="ranks sharing this machine's CPUs (default 1)")
    parser.add_argument("--keep-order", action="store_true",
                        help="the job needs batches in the sampler's order: never try "
                             "in_order=False")
    add_run_limits(parser, "trial finishes", "in the trials")
    parser.add_argument("--out", help="write the recommended settings to this JSON file")
    add_speedscope(parser)
    add_json(parser)
    add_db(parser)


def render_tune_text(result: TuneResult) -> str:
    if result.failed:
        return f"ERROR: {result.error_message}"
    if result.status == "stopped" or not result.recommended:
        return "Tuning stopped before a recommendation."
    lines = [result.snippet or "", ""]
    base = result.baseline or {}
    uncertainty = result.uncertainty_pct
    noise = f" (±{uncertainty:.0f}%)" if uncertainty is not None else ""
    lines.append(f"expected: {result.expected_samples_per_s:.0f} samples/s{noise}")
    if base.get("samples_per_s"):
        lines.append(f"baseline ({base['source']}): {base['samples_per_s']:.0f} samples/s -> "
                     + speedup_text(base))
    if base.get("claimed_from"):
        lines.append(f"claimed from: {base['claimed_from']}")
    announced, floor = result.announced(), result.against_floor()
    lines.append(f"tuned in {result.tuning_seconds:.1f} s over {len(result.trials)} trials"
                 + (f" (announced: {announced})" if announced else "")
                 + (f", {floor}" if floor else ""))
    lines.append("")
    lines += [f"- {reason}" for reason in result.reasons]
    stacks = result.stacks or {}
    where = stacks_text(stacks or None, stacks.get("stages") or (), stacks.get("hotspots") or ())
    if where:
        lines += ["", "over the trials, " + where[0]] + where[1:]
    lines += ceiling_text(result.ceiling, result.what_if, result.fixes)
    for warning in result.warnings:
        lines.append(f"warning [{warning.code}]: {warning.message}")
    return "\n".join(lines)


class _TrialProgress:
    """A line on stderr per finished trial (stdout stays clean for --json)."""

    def on_event(self, event: protocol.Event) -> None:
        if isinstance(event, protocol.Ready):
            sys.stderr.write("tuning: dataset loaded, measuring...\n")
        elif isinstance(event, protocol.Plan):
            sys.stderr.write(f"tuning: {event.plan.text()}\n")
        elif isinstance(event, protocol.Measured) and isinstance(event.trial, TrialResult):
            t = event.trial
            idle = t.consumer_idle_frac
            extra = f", consumer idle {idle:.0%}" if idle is not None else ""
            order = "" if t.in_order else ", in_order=False"
            sys.stderr.write(f"  [{t.phase}] num_workers={t.num_workers:<3d} "
                             f"{t.samples_per_s:10.1f} samples/s{extra}{order}\n")
        sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    request = RunRequest(
        target=args.target, settings=settings_from_args(args), step_ms=args.step_ms,
        timeout_s=args.timeout_s, kind="tune", budget_s=args.budget_s,
        max_workers=args.max_workers, local_world_size=args.local_world_size,
        keep_order=args.keep_order, sample_stacks=not args.no_stacks,
    )
    store = RunStore(args.db)
    handle = run_to_completion(request, store, on_event=_TrialProgress().on_event)
    result = replace(handle.live.tune_result(handle.state.value), run_id=handle.run_id)
    if args.out and result.recommended:
        with open_private(args.out) as handle_out:
            json.dump(settings_file(result), handle_out, indent=2)
        result = replace(result, settings_file=args.out)
    stacks = result.stacks or {}
    write_speedscope(args.speedscope, stacks.get("collapsed") if stacks.get("enough") else None,
                     f"tune of {args.target}, all trials")
    if args.json:
        print_json(result.to_dict())
    else:
        print(render_tune_text(result))
        if args.out and result.recommended:
            print(f"\nsettings written to {args.out}")
    return EXIT_RUN_FAILED if result.failed else EXIT_OK
