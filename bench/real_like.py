"""Is the tool right on realistic datasets? Its rates, claims and picks, checked with plain loops.

The corpus is tests/real/: dataset modules shaped like real users' (detection boxes, detectron2
list batches, a JPEG folder, webdataset-style whole batches with batch_size=None, serialized
records, a memmap store, long-tailed and many-class labels, a duck-typed table with UserDict
batches, audio with a train_step, workers that print) and slow pipelines (SLOW: an ImageNet
train transform at batch 256 with 4-batch epochs, a WAV -> log-Mel pipeline with a CPU CNN
step, CPU-bound features with a CPU MLP step). Each module's settings (batch_size,
collate_fn, sampler, dataloader_kwargs, train_step) and EXPECTED are the truth, and
tests/real/plain_loop.py's plain_rate measures a plain DataLoader with them, independently of the
tool. For each module, one row:
  1. reported/plain: the samples/s a real engine profile run reports (child process, real
     workers, the module's own settings, no consumer) against plain_rate at the same settings,
     also in a fresh process, so both pay the same start-up, import and fork costs (and this
     process never accumulates workers); the median of the per-pair ratios.
  2. cost/batch: from the same pairs, 1/tool batches/s - 1/plain batches/s in microseconds
     (median): what measuring adds to each batch.
  3. claimed vs verified: the tuner through the engine (kind="tune"); its claimed speedup over the
     module's own settings (with its 95% interval) against the verified one: plain loops of the
     module's settings vs the same with the recommended kwargs on top (num_workers, pin_memory,
     prefetch_factor, persistent_workers, batch_size), paired; the median ratio. When the tool
     claims nothing, its note is printed instead.
  4. pick/best: a plain grid of num_workers x persistent_workers (False, and True where
     num_workers > 0; the module's other settings kept), passes in alternating order (A..Z,
     Z..A, ...), the median per point; the pick's point (its num_workers, persistent_workers and
     prefetch_factor) over the best. The grid's best is the maximum of noisy points, so it is
     biased high (bench/tune_quality.py).
  5. 3. is repeated (--repeats) with a fresh tune each time, to show whether the pick is stable;
     the grid is measured once, after the tunes, with every pick on it.

Why interleaved pairs: this 2-core machine is shared and its speed drifts by more than the
effects measured here (the same plain loop differs by 1.7x from one minute to the next, see
bench/overhead.py). Two runs back to back see nearly the same machine, so their ratio cancels the
drift; alternating which goes first (A B, B A, ...) cancels what the order itself does (a warm
page cache, a neighbour's burst that starts or ends); the median of the per-pair ratios resists
the odd pair a noisy neighbour spoils. Pairs cannot rescue a run made while another heavy job
shares the cores: loading in the main process with torch ops (webdataset_style at num_workers=0)
then swings from ~280k to ~6k samples/s between runs seconds apart, so run it on a quiet machine.

Plain loops, as a job runs them: each times at least --min-batches batches (besides --seconds),
so a pipeline of ~1 s batches is timed over tens of batches; when an epoch is short (no more
batches than the warm-up or --min-batches), the first epoch is the warm-up and whole epochs are
timed, so non-persistent workers restart (and pay their start-up) every epoch as in a job.

With a train_step (audio_like, audio_mel, cpu_mlp; marked * in the table), the plain loops of 3.
and 4. are TRAINING loops: each batch fetched is passed to the module's train_step, the rate is
samples/s of the whole loop; the tuner, as users run it, feeds the step too, so its claim and its
pick are judged on what a job gets. 1. and 2. stay load-only (the profile runs with step_ms=0).

Workers and fixtures are memory-heavy; run it under the memory cap, which covers the whole
process tree (engine children, plain loops, their workers):

    ../shared/tools/capped 8 -- python3 bench/real_like.py [--only NAME] [--slow] [--seconds 3]
        [--min-batches 20] [--pairs 3] [--repeats 3] [--passes 3] [--budget-s S] [--quick]
        [--fast] [--profile-only] [--claims-only] [--json PATH]

--only NAME: the modules whose name contains NAME; --slow: only the SLOW pipelines; --fast: all
but them.
--quick: 1 pair, 1 repeat, one grid pass over 0, 2, 4 workers (each also persistent) and the
pick, at least 8 batches per loop (unless given): a smoke run. The tables print "!" beside a
figure that misses its target; a pick shown as "4p" has persistent_workers=True.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import psutil  # noqa: E402

from dataloader_tuner.run.runner import RunRequest, run_to_completion  # noqa: E402
from tests.real.plain_loop import load_module  # noqa: E402

# Slow pipelines (~0.1-1 s a batch; two with a CPU train_step): minutes per module.
SLOW = ["imagenet_like", "audio_mel", "cpu_mlp"]
MODULES = ["detection", "detectron2_style", "jpeg_folder", "webdataset_style",
           "copy_on_read_fixed", "memmap_store", "long_tail", "many_classes", "duck_typed",
           "audio_like", "noisy_worker", "imagefolder_compose", "tokenized_text"] + SLOW
LATENCY_LIKE = {"copy_on_read_fixed", "memmap_store"}  # per-sample waits: more workers pay
GRID = [0, 1, 2, 3, 4, 6, 8]
GRID_LATENCY = GRID + [12, 16]
GRID_QUICK = [0, 2, 4]
CLAIM_TOLERANCE = 0.15
MIN_BATCHES, MIN_BATCHES_QUICK = 20, 8
# The plain loop in a fresh interpreter: its result is the last line of stdout. argv: target,
# seconds, DataLoader overrides (JSON), plain_rate's options (JSON: with_step, min_batches, ...).
# The tool's own settings become the worker_init_fn a user's script gets from load_settings.
PLAIN_CHILD = """
import json, sys
from tests.real.plain_loop import load_module, plain_rate
from dataloader_tuner import KeepFreedMemory, LimitThreads
target, seconds, overrides, options = sys.argv[1], float(sys.argv[2]), *map(json.loads, sys.argv[3:])
keep, threads = overrides.pop("keep_freed_memory", False), overrides.pop("worker_threads", None)
if keep or threads == 1:
    init_fn = getattr(load_module(target)[0], "worker_init_fn", None)
    init_fn = KeepFreedMemory(init_fn) if keep else init_fn
    overrides["worker_init_fn"] = LimitThreads(init_fn) if threads == 1 else init_fn
print(json.dumps(plain_rate(target, seconds, **options, **overrides)))
"""
LEGEND = ("targets: reported/plain 0.95-1.05; claimed/verified within 0.85-1.15; "
          "pick/best >= 0.95; the same pick every repeat (! marks a miss)")


class BenchError(Exception):
    """A run failed; the module's row says why and the bench goes on."""


# -- one measurement each -----------------------------------------------------------------------

def plain(target: str, seconds: float, overrides: dict | None = None,
          options: dict | None = None) -> dict:
    """plain_rate in a fresh process: {samples_per_s, batches_per_s, ...}; ``options`` are
    plain_rate's own (with_step, min_batches, whole_epochs). Waited for; on a timeout its
    whole process group (the loop's workers too) is killed and reaped."""
    options = options or {}
    cmd = [sys.executable, "-c", PLAIN_CHILD, target, str(seconds), json.dumps(overrides or {}),
           json.dumps(options)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=seconds + 300 + 10 * options.get("min_batches", 0))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        reap_adopted()
        raise BenchError(f"plain loop {overrides or {}} timed out")
    if proc.returncode != 0:
        raise BenchError(f"plain loop {overrides or {}} failed: {err.strip()[-600:]}")
    result = json.loads(out.strip().splitlines()[-1])
    if not result["samples_per_s"]:
        raise BenchError(f"plain loop {overrides or {}}: no batch after warm-up")
    result["batches_per_s"] = result["batches"] / result["seconds"] if result["seconds"] else 0.0
    return result


def reap_adopted() -> None:
    """The engine makes this process a subreaper: reap any orphaned worker it adopted."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def engine_run(request: RunRequest) -> dict:
    """A real engine run to its end (its child and workers reaped); its summary document."""
    handle = run_to_completion(request)
    try:
        doc = handle.live.result(handle.state.value).to_dict()
    finally:
        handle.close()
    if doc.get("status") != "ok":
        error = doc.get("error") or {}
        raise BenchError(f"engine {request.kind} run: {doc.get('status')}: "
                         f"{error.get('message', '')}")
    return doc


def profiled(target: str, seconds: float) -> dict:
    """The engine's reported rates for the module's own settings, loading only."""
    doc = engine_run(RunRequest(target=target, settings={}, seconds=seconds, step_ms=0))
    if not doc["samples_per_s"]:
        raise BenchError("engine profile run: no steady state")
    return {"samples_per_s": doc["samples_per_s"], "batches_per_s": doc["batches_per_s"]}


def interleaved(measure_a, measure_b, pairs: int) -> list[tuple[dict, dict]]:
    """``pairs`` pairs (a, b), measured back to back, alternating which goes first."""
    results = []
    for pair in range(pairs):
        if pair % 2 == 0:
            a = measure_a()
            b = measure_b()
        else:
            b = measure_b()
            a = measure_a()
        results.append((a, b))
    return results


# -- the module's settings and the tuner's --------------------------------------------------------

def own_settings(module) -> dict:
    """The tuned settings as the module sets them (DataLoader's defaults where it does not)."""
    kwargs = getattr(module, "dataloader_kwargs", None) or {}
    own = {"batch_size": getattr(module, "batch_size", 1), "num_workers": 0,
           "pin_memory": False, "prefetch_factor": None, "persistent_workers": False}
    own.update({k: v for k, v in kwargs.items() if k in own})
    return own


def effective(settings: dict) -> tuple:
    """Settings as DataLoader applies them: prefetch and persistence only matter with workers."""
    n = settings["num_workers"]
    return (settings["batch_size"], n, bool(settings["pin_memory"]),
            (settings["prefetch_factor"] or 2) if n else None,
            bool(settings["persistent_workers"]) if n else False, tools_own(settings))


# The tool's own settings a point can carry (worker_init_fns), by their label.
TOOLS_OWN = {"keep": ("keep_freed_memory", True), "1t": ("worker_threads", 1)}


def tools_own(settings: dict) -> tuple[str, ...]:
    """The labels of the tool's own settings in ``settings`` (with workers only)."""
    return tuple(label for label, (key, value) in TOOLS_OWN.items()
                 if settings.get("num_workers") and settings.get(key) == value)


def recommended_overrides(own: dict, rec: dict) -> dict:
    """The module's settings with the recommendation on top; worker-only settings it leaves
    out return to DataLoader's defaults (as dataloader_tuner.child.tuning.recommended_config does)."""
    n = rec["num_workers"]
    overrides = {"batch_size": rec.get("batch_size", own["batch_size"]), "num_workers": n,
                 "pin_memory": bool(rec.get("pin_memory")),
                 "prefetch_factor": rec.get("prefetch_factor") if n else None,
                 "persistent_workers": bool(rec.get("persistent_workers")) if n else False}
    for tools_own in ("keep_freed_memory", "worker_threads"):  # worker_init_fns (PLAIN_CHILD)
        if n and rec.get(tools_own):
            overrides[tools_own] = rec[tools_own]
    return overrides


def point_key(settings: dict) -> tuple:
    """A grid point as (num_workers, persistent_workers, prefetch_factor, the tool's own), as
    DataLoader applies them (prefetch_factor None means its default, 2)."""
    _, n, _, prefetch, persistent, own = effective(settings)
    return (n, persistent, prefetch, own)


def point_overrides(key: tuple) -> dict:
    """A grid point's overrides: the worker settings only (the module's others kept), and
    what DataLoader refuses without workers."""
    n, persistent, prefetch, own = key
    if not n:
        return {"num_workers": 0, "prefetch_factor": None, "persistent_workers": False}
    return {"num_workers": n, "persistent_workers": persistent, "prefetch_factor": prefetch,
            **dict(TOOLS_OWN[label] for label in own)}


def point_label(key: tuple, base_prefetch: int = 2) -> str:
    """"4" / "4p" (persistent), with "/pf3" when its prefetch_factor is not the grid's and
    "+keep" / "+1t" for the tool's own worker_init_fns."""
    n, persistent, prefetch, own = key
    return (f"{n}{'p' if persistent else ''}"
            + (f"/pf{prefetch}" if n and prefetch != base_prefetch else "")
            + "".join(f"+{label}" for label in own))


def loop_options(args, with_step: bool) -> dict:
    """plain_rate's options for the loops judging the tuner: training loops when the module has
    a train_step, at least --min-batches batches, whole epochs when epochs are short."""
    return {"with_step": with_step, "min_batches": args.min_batches, "whole_epochs": True}


def describe(settings: dict) -> str:
    bs, n, pin, prefetch, persistent, _ = effective(settings)
    text = f"bs={bs} nw={n} pin={pin}"
    return text + (f" pf={prefetch} pers={persistent}" if n else "")


# -- the four figures -------------------------------------------------------------------------

def reported_vs_plain(target: str, expected_per_batch: int | None, args) -> dict:
    """1. and 2.: the tool's reported rate over plain_rate's, and the cost per batch; with the
    samples per batch each counted, against the module's EXPECTED (short last batches aside)."""
    profile_s = [args.seconds]

    def measure_plain() -> dict:
        result = plain(target, args.seconds, options={"min_batches": args.min_batches})
        if result["seconds"] > 1.2 * args.seconds:  # slow batches: --min-batches ruled
            profile_s[0] = result["seconds"]  # the profile runs as long as that loop timed
        return result

    # plain first in the first pair: the profile's length follows the plain loop's
    runs = [(tool, base) for base, tool in interleaved(
        measure_plain, lambda: profiled(target, profile_s[0]), args.pairs)]
    ratios = [tool["samples_per_s"] / base["samples_per_s"] for tool, base in runs]
    costs = [1e6 * (1 / tool["batches_per_s"] - 1 / base["batches_per_s"]) for tool, base in runs]
    for i, ((tool, base), ratio, cost) in enumerate(zip(runs, ratios, costs), 1):
        print(f"  pair {i}: reported {tool['samples_per_s']:9.1f}/s  plain "
              f"{base['samples_per_s']:9.1f}/s  ratio {ratio:.3f}  cost {cost:+8.1f} us/batch",
              flush=True)
    per_batch = [statistics.median(r["samples_per_s"] / r["batches_per_s"] for r in side)
                 for side in zip(*runs)]
    print(f"  samples/batch: tool {per_batch[0]:.1f}, plain {per_batch[1]:.1f}, "
          f"EXPECTED {expected_per_batch}", flush=True)
    return {"reported": statistics.median(t["samples_per_s"] for t, _ in runs),
            "plain": statistics.median(b["samples_per_s"] for _, b in runs),
            "ratio": statistics.median(ratios), "cost_us": statistics.median(costs),
            "ratios": ratios, "costs_us": costs, "samples_per_batch": per_batch}


def tune_and_verify(target: str, own: dict, args, with_step: bool = False) -> dict:
    """3.: one tune; its claimed speedup against the verified one, plain (training loops when
    the module has a train_step) and paired."""
    started = time.monotonic()
    doc = engine_run(RunRequest(target=target, kind="tune", budget_s=args.budget_s))
    tune_s = time.monotonic() - started
    baseline = doc.get("baseline") or {}
    plan = doc.get("plan") if isinstance(doc.get("plan"), dict) else {}
    overrides = recommended_overrides(own, doc["recommended"])
    options = loop_options(args, with_step)
    result = {"pick": overrides, "pick_key": point_key(overrides), "tune_s": tune_s,
              "tuning_seconds": doc.get("tuning_seconds"), "announced_s": plan.get("announced_s"),
              "announced_at_most_s": plan.get("announced_at_most_s"),
              "floor_s": plan.get("floor_s"), "claimed": baseline.get("speedup"),
              "claimed_pct": baseline.get("speedup_pct"), "note": baseline.get("speedup_note"),
              "expected_samples_per_s": doc.get("expected_samples_per_s"),
              "baseline_samples_per_s": baseline.get("samples_per_s")}
    if effective(overrides) == effective(own):
        result.update(verified=1.0, verified_ratios=[], same=True)  # identical: nothing to run
    else:
        runs = interleaved(lambda: plain(target, args.seconds, options=options),
                           lambda: plain(target, args.seconds, overrides, options), args.pairs)
        ratios = [rec["samples_per_s"] / base["samples_per_s"] for base, rec in runs]
        result.update(verified=statistics.median(ratios), verified_ratios=ratios, same=False,
                      plain_baseline=[base["samples_per_s"] for base, _ in runs],
                      plain_pick=[rec["samples_per_s"] for _, rec in runs])
    claimed = result["claimed"]
    result["claim_ratio"] = claimed / result["verified"] if claimed is not None else None
    return result


def claim_interval(tune: dict) -> tuple[float, float] | None:
    """The claim's interval: speedup x (1 -/+ speedup_pct %)."""
    if tune["claimed"] is None:
        return None
    pct = (tune["claimed_pct"] or 0) / 100
    return tune["claimed"] * (1 - pct), tune["claimed"] * (1 + pct)


def seconds_text(value) -> str:
    return "-" if value is None else f"{value:.0f} s"


def print_tune(number: int, tune: dict, with_step: bool = False) -> None:
    interval = claim_interval(tune)
    claim = (f"claimed {tune['claimed']:.2f}x ±{tune['claimed_pct'] or 0:.0f}% "
             f"[{interval[0]:.2f}-{interval[1]:.2f}]"
             if interval is not None else f"no claim ({tune['note']})")
    verified = ("verified 1.00x (same settings as the module's)" if tune["same"] else
                f"verified {tune['verified']:.2f}x [" + " ".join(
                    f"{p:.0f}/{b:.0f}" for p, b in zip(tune["plain_pick"], tune["plain_baseline"]))
                + " samples/s]")
    ratio = (f"; claimed/verified {tune['claim_ratio']:.2f}"
             if tune["claim_ratio"] is not None else "")
    print(f"  tune {number} ({tune['tune_s']:.0f} s; tuning_seconds "
          f"{seconds_text(tune['tuning_seconds'])}, announced "
          f"{seconds_text(tune['announced_s'])}, at most "
          f"{seconds_text(tune.get('announced_at_most_s'))}, floor "
          f"{seconds_text(tune.get('floor_s'))}): pick {describe(tune['pick'])}\n"
          f"    tool: baseline {tune['baseline_samples_per_s'] or 0:.0f}/s, pick expected "
          f"{tune['expected_samples_per_s'] or 0:.0f}/s, {claim}\n"
          f"    plain{' training loops' if with_step else ''}: {verified}{ratio}", flush=True)


def grid_points(name: str, quick: bool, own: dict, picks: list[tuple]) -> list[tuple]:
    """num_workers in the grid x persistent_workers (True only with workers), at the module's
    prefetch_factor, and every pick's own point."""
    base = GRID_QUICK if quick else (GRID_LATENCY if name in LATENCY_LIKE else GRID)
    prefetch = own["prefetch_factor"] or 2
    points = {(0, False, None, ())}
    points |= {(n, persistent, prefetch, ()) for n in base if n for persistent in (False, True)}
    return sorted(points | set(picks), key=lambda k: (k[0], k[1], k[2] or 0, k[3]))


def grid(target: str, points: list[tuple], args, options: dict,
         base_prefetch: int = 2) -> dict[tuple, float]:
    """4.: plain samples/s by point (training loops when options say so), passes in
    alternating order, the median per point."""
    rates: dict[tuple, list[float]] = {key: [] for key in points}
    for pass_no in range(args.passes):
        for key in (points if pass_no % 2 == 0 else points[::-1]):
            rates[key].append(plain(target, args.seconds, point_overrides(key),
                                    options)["samples_per_s"])
        print(f"  grid pass {pass_no + 1}: " + ", ".join(
            f"{point_label(k, base_prefetch)}:{rates[k][-1]:.0f}" for k in points), flush=True)
    return {key: statistics.median(v) for key, v in rates.items()}


# -- one module, the table ------------------------------------------------------------------

def bench_module(name: str, args) -> dict:
    target = os.path.join(ROOT, "tests", "real", f"{name}.py")
    module, _ = load_module(target)
    own = own_settings(module)
    with_step = callable(getattr(module, "train_step", None))
    row = {"module": name, "own": own, "train_step": with_step,
           "samples_per_batch": module.EXPECTED.get("samples_per_batch")}
    base_prefetch = own["prefetch_factor"] or 2
    print(f"\n== {name} ({describe(own)}{', train_step' if row['train_step'] else ''})",
          flush=True)
    try:
        if not args.claims_only:
            row["profile"] = reported_vs_plain(target, row["samples_per_batch"], args)
        if args.profile_only:
            return row
        row["tunes"] = []
        for number in range(1, args.repeats + 1):
            row["tunes"].append(tune_and_verify(target, own, args, with_step))
            print_tune(number, row["tunes"][-1], with_step)
        if args.claims_only:
            return row
        picks = [t["pick_key"] for t in row["tunes"]]
        rates = grid(target, grid_points(name, args.quick, own, picks), args,
                     loop_options(args, with_step), base_prefetch)
        best = max(rates, key=rates.get)
        for tune in row["tunes"]:
            tune["pick_score"] = rates[tune["pick_key"]] / rates[best]
            tune["pick_label"] = point_label(tune["pick_key"], base_prefetch)
        # labels as keys: the JSON rows need string keys
        row["grid"] = {point_label(k, base_prefetch): r for k, r in rates.items()}
        row["grid_best"] = point_label(best, base_prefetch)
        print(f"  grid median{' (training loops)' if with_step else ''}: "
              + ", ".join(f"{point_label(k, base_prefetch)}:{r:.0f}" for k, r in rates.items())
              + f"; best {row['grid_best']}; picks "
              + "[" + ", ".join(t["pick_label"] for t in row["tunes"]) + "] score "
              + " ".join(f"{t['pick_score']:.2f}" for t in row["tunes"]), flush=True)
    except BenchError as exc:
        row["error"] = str(exc)
        print(f"  FAILED: {exc}", flush=True)
    return row


def mark(text: str, ok: bool) -> str:
    return text + (" " if ok else "!")


# Columns that can miss their target are printed with one more character: " " or "!".
HEADER = (f"{'module':19s} {'reported/s':>10s} {'plain/s':>10s} {'rep/plain':>9s}  "
          f"{'cost us/b':>10s}  {'rep':>3s} {'pick':>4s}  {'claimed':>12s} {'verified':>9s} "
          f"{'claim/ver':>9s}  {'pick/best':>9s}")


def profile_cells(row: dict) -> str:
    p = row["profile"]
    ratio = mark(format(p["ratio"], "9.3f"), 0.95 <= p["ratio"] <= 1.05)
    return f"{p['reported']:10.1f} {p['plain']:10.1f} {ratio:>10s} {p['cost_us']:+10.1f}"


def tune_cells(number: int, tune: dict, stable: bool) -> str:
    claimed = (f"{tune['claimed']:.2f}x±{tune['claimed_pct'] or 0:.0f}%"
               if tune["claimed"] is not None else "no claim")
    ratio, score = tune["claim_ratio"], tune.get("pick_score")
    ratio_text = "-" if ratio is None else mark(f"{ratio:9.2f}", abs(ratio - 1) <= CLAIM_TOLERANCE)
    score_text = "-" if score is None else mark(f"{score:9.2f}", score >= 0.95)
    pick = mark(f"{tune.get('pick_label') or point_label(tune['pick_key']):>4s}", stable)
    return (f"  {number:3d} {pick} {claimed:>12s} {tune['verified']:8.2f}x "
            f"{ratio_text:>10s} {score_text:>10s}")


def table_lines(row: dict) -> list[str]:
    """The row's summary lines: the profile figures, then one line per tune (repeat)."""
    head = f"{row['module'] + ('*' if row['train_step'] else ''):19s} "
    if "profile" not in row and not row.get("tunes"):
        return [head + f"FAILED: {row.get('error')}"]
    head += profile_cells(row) if "profile" in row else " " * 43  # --claims-only
    tunes = row.get("tunes", [])
    stable = len({t["pick_key"] for t in tunes}) <= 1
    lines = [(head if number == 1 else " " * len(head)) + tune_cells(number, tune, stable)
             for number, tune in enumerate(tunes, 1)] or [head]
    if "error" in row:
        lines.append(" " * len(head) + f"  FAILED: {row['error']}")
    return lines


def notes(rows: list[dict]) -> list[str]:
    """What the table cannot say in a cell: claims not made, and the train_step caveat."""
    out = []
    for row in rows:
        if row["train_step"]:
            out.append(f"{row['module']}*: has a train_step; claim/ver and pick/best are on plain "
                       "TRAINING loops (each batch through train_step), as the tuner feeds the "
                       "step; reported/plain and cost/batch are load-only")
        for number, tune in enumerate(row.get("tunes", []), 1):
            if tune["claimed"] is None:
                out.append(f"{row['module']} tune {number}: {tune['note']}")
    return out


def left_behind() -> list[str]:
    """Processes of ours still alive (or unreaped) at the end: there should be none."""
    reap_adopted()
    return [f"{c.pid} {' '.join(c.cmdline()[:4])}"
            for c in psutil.Process().children(recursive=True) if c.is_running()]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="only the modules whose name contains this")
    parser.add_argument("--slow", action="store_true",
                        help=f"only the slow pipelines ({', '.join(SLOW)})")
    parser.add_argument("--fast", action="store_true", help="all but the slow pipelines")
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--min-batches", type=int,
                        help=f"batches each plain loop times at least ({MIN_BATCHES}; "
                             f"{MIN_BATCHES_QUICK} with --quick)")
    parser.add_argument("--pairs", type=int, help="interleaved pairs per comparison (3)")
    parser.add_argument("--repeats", type=int, help="tunes per module (3)")
    parser.add_argument("--passes", type=int, help="grid passes (3)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="the tuner's hard time limit (default: none, as users run it)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1 pair, 1 repeat, 1 grid pass over 0, 2, 4 (each also "
                             f"persistent) and the pick, {MIN_BATCHES_QUICK} batches per loop, "
                             "unless given")
    parser.add_argument("--profile-only", action="store_true",
                        help="1. and 2. only: the reported rate against plain loops, no tunes")
    parser.add_argument("--claims-only", action="store_true",
                        help="3. only: tunes and plain loops verifying their claims, no profile "
                             "comparison nor grid")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args()
    default = 1 if args.quick else 3
    for name in ("pairs", "repeats", "passes"):
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.min_batches is None:
        args.min_batches = MIN_BATCHES_QUICK if args.quick else MIN_BATCHES
    return args


def main() -> None:
    args = parse_args()
    pool = SLOW if args.slow else [n for n in MODULES if n not in SLOW] if args.fast else MODULES
    names = [n for n in pool if not args.only or args.only in n]
    if not names:
        raise SystemExit(f"no module matches {args.only!r}; modules: {', '.join(MODULES)}")
    print(f"{len(names)} module(s); {args.seconds:g} s and at least {args.min_batches} batches "
          f"per measurement, {args.pairs} pair(s), {args.repeats} tune(s) "
          + (f"of at most {args.budget_s:g} s" if args.budget_s else "(no time limit)")
          + f", {args.passes} grid pass(es)")
    started = time.monotonic()
    rows = [bench_module(name, args) for name in names]
    print(f"\n{LEGEND}\n{HEADER}")
    for row in rows:
        print("\n".join(table_lines(row)))
    for line in notes(rows):
        print(line)
    leftover = left_behind()
    print(f"bench took {time.monotonic() - started:.0f} s; processes left behind: "
          f"{len(leftover)}" + "".join(f"\n  {p}" for p in leftover))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1, default=str)
        print(f"rows written to {args.json}")


if __name__ == "__main__":
    main()
