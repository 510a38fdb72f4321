"""``python -m engine tune``: search the loader settings and print (or save) the recommendation."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from engine import protocol
from engine.analyse.report import speedup_text
from engine.analyse.results import TuneResult
from engine.settings import settings_file
from engine.run.runner import RunRequest, run_to_completion
from engine.run.store import RunStore


def add_tune_parser(sub, add_common, positive_int, non_negative_float, batch_size_arg) -> None:
    tune = sub.add_parser("tune", help="find the best num_workers / pin_memory / prefetch settings")
    tune.add_argument("target", help="path/to/data.py[:attr] or pkg.module[:attr]")
    tune.add_argument("--batch-size", type=batch_size_arg, default=argparse.SUPPRESS,
                      help="N, or none when the dataset yields whole batches; default: the "
                           "module's batch_size, else 32")
    tune.add_argument("--step-ms", type=non_negative_float,
                      help="simulate a training step of this many ms per batch (0: none); "
                           "default: the module's train_step if it has one")
    tune.add_argument("--budget-s", type=float, default=protocol.DEFAULT_BUDGET_S,
                      help="stop searching after this many seconds (default %(default)g)")
    tune.add_argument("--max-workers", type=positive_int, default=protocol.DEFAULT_MAX_WORKERS,
                      help="never try more workers than this (default %(default)d)")
    tune.add_argument("--local-world-size", type=positive_int, default=1,
                      help="ranks sharing this machine's CPUs (default 1)")
    tune.add_argument("--timeout-s", type=float, default=protocol.DEFAULT_TIMEOUT_S,
                      help="fail if no trial finishes for this long")
    tune.add_argument("--out", help="write the recommended settings to this JSON file")
    add_common(tune)


def render_tune_text(result: TuneResult) -> str:
    if result.failed:
        return f"ERROR: {result.error_message}"
    if result.status == "stopped" or not result.recommended:
        return "Tuning stopped before a recommendation."
    lines = [result.snippet, ""]
    base = result.baseline or {}
    uncertainty = result.uncertainty_pct
    noise = f" (±{uncertainty:.0f}%)" if uncertainty is not None else ""
    lines.append(f"expected: {result.expected_samples_per_s:.0f} samples/s{noise}")
    if base.get("samples_per_s"):
        lines.append(f"baseline ({base['source']}): {base['samples_per_s']:.0f} samples/s -> "
                     + speedup_text(base))
    lines.append(f"tuned in {result.tuning_seconds:.1f} s over {len(result.trials)} trials")
    lines.append("")
    lines += [f"- {reason}" for reason in result.reasons]
    for warning in result.warnings:
        lines.append(f"warning [{warning.code}]: {warning.message}")
    return "\n".join(lines)


class _TrialProgress:
    """A line on stderr per finished trial (stdout stays clean for --json)."""

    def on_event(self, event: protocol.Event) -> None:
        if isinstance(event, protocol.Ready):
            sys.stderr.write("tuning: dataset loaded, measuring...\n")
        elif isinstance(event, protocol.Trial):
            t = event.trial
            idle = t.get("consumer_idle_frac")
            extra = f", consumer idle {idle:.0%}" if idle is not None else ""
            sys.stderr.write(f"  [{t['phase']}] num_workers={t['num_workers']:<3d} "
                             f"{t['samples_per_s']:10.1f} samples/s{extra}\n")
        sys.stderr.flush()


def cmd_tune(args: argparse.Namespace) -> int:
    from engine.cli.main import settings_from_args

    request = RunRequest(
        target=args.target, settings=settings_from_args(args), step_ms=args.step_ms,
        timeout_s=args.timeout_s, kind="tune", budget_s=args.budget_s,
        max_workers=args.max_workers, local_world_size=args.local_world_size,
    )
    store = RunStore(args.db)
    handle = run_to_completion(request, store, on_event=_TrialProgress().on_event)
    result = replace(handle.live.summary(handle.state.value), run_id=handle.run_id)
    if args.out and result.recommended:
        with open(args.out, "w", encoding="utf-8") as handle_out:
            json.dump(settings_file(result), handle_out, indent=2)
        result = replace(result, settings_file=args.out)
    if args.json:
        from engine.cli.main import print_json  # cli imports this module to add its parser

        print_json(result.to_dict())
    else:
        print(render_tune_text(result))
        if args.out and result.recommended:
            print(f"\nsettings written to {args.out}")
    return 1 if result.failed else 0
