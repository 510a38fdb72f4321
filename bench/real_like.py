"""Is the tool right on realistic datasets? Its rates, claims and picks, checked with plain loops.

The corpus is tests/real/: dataset modules shaped like real users' (detection boxes, detectron2
list batches, a JPEG folder, webdataset-style whole batches with batch_size=None, serialized
records, a memmap store, long-tailed and many-class labels, a duck-typed table with UserDict
batches, audio with a train_step, workers that print). Each module's settings (batch_size,
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
  4. pick/best: a plain num_workers grid (the module's other settings kept), passes in
     alternating order (A..Z, Z..A, ...), the median per point; the pick's point over the best.
     The grid's best is the maximum of noisy points, so it is biased high (bench/tune_quality.py).
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

With a train_step (audio_like), the rates here are load-only (the profile runs with step_ms=0,
as plain_rate loads only), but the tuner, as users run it, feeds the step: its claim includes
the step and it picks the fewest workers that keep the step fed, so its pick may fall below the
load-only grid's best by design. The row is kept and marked.

Workers and fixtures are memory-heavy; run it under the memory cap, which covers the whole
process tree (engine children, plain loops, their workers):

    ../shared/tools/capped 8 -- python3 bench/real_like.py [--only NAME] [--seconds 3]
        [--pairs 3] [--repeats 3] [--passes 3] [--budget-s 45] [--quick] [--json PATH]

--quick: 1 pair, 1 repeat, one grid pass over 0, 2, 4 workers and the pick (unless given): a
smoke run. The tables print "!" beside a figure that misses its target.
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

MODULES = ["detection", "detectron2_style", "jpeg_folder", "webdataset_style",
           "copy_on_read_fixed", "memmap_store", "long_tail", "many_classes", "duck_typed",
           "audio_like", "noisy_worker"]
LATENCY_LIKE = {"copy_on_read_fixed", "memmap_store"}  # per-sample waits: more workers pay
GRID = [0, 1, 2, 3, 4, 6, 8]
GRID_LATENCY = GRID + [12, 16]
GRID_QUICK = [0, 2, 4]
CLAIM_TOLERANCE = 0.15
# The plain loop in a fresh interpreter: its result is the last line of stdout.
PLAIN_CHILD = ("import json, sys; from tests.real.plain_loop import plain_rate; "
               "print(json.dumps(plain_rate(sys.argv[1], float(sys.argv[2]), "
               "**json.loads(sys.argv[3]))))")
LEGEND = ("targets: reported/plain 0.95-1.05; claimed/verified within 0.85-1.15; "
          "pick/best >= 0.95; the same pick every repeat (! marks a miss)")


class BenchError(Exception):
    """A run failed; the module's row says why and the bench goes on."""


# -- one measurement each -----------------------------------------------------------------------

def plain(target: str, seconds: float, overrides: dict | None = None) -> dict:
    """plain_rate in a fresh process: {samples_per_s, batches_per_s, ...}. Waited for; on a
    timeout its whole process group (the loop's workers too) is killed and reaped."""
    cmd = [sys.executable, "-c", PLAIN_CHILD, target, str(seconds), json.dumps(overrides or {})]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=seconds + 300)
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
        doc = handle.live.summary(handle.state.value).to_dict()
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
            bool(settings["persistent_workers"]) if n else False)


def recommended_overrides(own: dict, rec: dict) -> dict:
    """The module's settings with the recommendation on top; worker-only settings it leaves
    out return to DataLoader's defaults (as dataloader_tuner.tune.offline.recommended_config does)."""
    n = rec["num_workers"]
    return {"batch_size": rec.get("batch_size", own["batch_size"]), "num_workers": n,
            "pin_memory": bool(rec.get("pin_memory")),
            "prefetch_factor": rec.get("prefetch_factor") if n else None,
            "persistent_workers": bool(rec.get("persistent_workers")) if n else False}


def workers_overrides(n: int) -> dict:
    """A grid point: only num_workers changes (and what DataLoader refuses without workers)."""
    return {"num_workers": n} if n else {"num_workers": 0, "prefetch_factor": None,
                                         "persistent_workers": False}


def describe(settings: dict) -> str:
    bs, n, pin, prefetch, persistent = effective(settings)
    text = f"bs={bs} nw={n} pin={pin}"
    return text + (f" pf={prefetch} pers={persistent}" if n else "")


# -- the four figures -------------------------------------------------------------------------

def reported_vs_plain(target: str, expected_per_batch: int | None, args) -> dict:
    """1. and 2.: the tool's reported rate over plain_rate's, and the cost per batch; with the
    samples per batch each counted, against the module's EXPECTED (short last batches aside)."""
    runs = interleaved(lambda: profiled(target, args.seconds),
                       lambda: plain(target, args.seconds), args.pairs)
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


def tune_and_verify(target: str, own: dict, args) -> dict:
    """3.: one tune; its claimed speedup against the verified one, plain and paired."""
    started = time.monotonic()
    doc = engine_run(RunRequest(target=target, kind="tune", budget_s=args.budget_s))
    tune_s = time.monotonic() - started
    baseline = doc.get("baseline") or {}
    overrides = recommended_overrides(own, doc["recommended"])
    result = {"pick": overrides, "tune_s": tune_s, "claimed": baseline.get("speedup"),
              "claimed_pct": baseline.get("speedup_pct"), "note": baseline.get("speedup_note"),
              "expected_samples_per_s": doc.get("expected_samples_per_s"),
              "baseline_samples_per_s": baseline.get("samples_per_s")}
    if effective(overrides) == effective(own):
        result.update(verified=1.0, verified_ratios=[], same=True)  # identical: nothing to run
    else:
        runs = interleaved(lambda: plain(target, args.seconds),
                           lambda: plain(target, args.seconds, overrides), args.pairs)
        ratios = [rec["samples_per_s"] / base["samples_per_s"] for base, rec in runs]
        result.update(verified=statistics.median(ratios), verified_ratios=ratios, same=False,
                      plain_baseline=[base["samples_per_s"] for base, _ in runs],
                      plain_pick=[rec["samples_per_s"] for _, rec in runs])
    claimed = result["claimed"]
    result["claim_ratio"] = claimed / result["verified"] if claimed is not None else None
    return result


def print_tune(number: int, tune: dict) -> None:
    claim = (f"claimed {tune['claimed']:.2f}x ±{tune['claimed_pct'] or 0:.0f}%"
             if tune["claimed"] is not None else f"no claim ({tune['note']})")
    verified = ("verified 1.00x (same settings as the module's)" if tune["same"] else
                f"verified {tune['verified']:.2f}x [" + " ".join(
                    f"{p:.0f}/{b:.0f}" for p, b in zip(tune["plain_pick"], tune["plain_baseline"]))
                + " samples/s]")
    ratio = (f"; claimed/verified {tune['claim_ratio']:.2f}"
             if tune["claim_ratio"] is not None else "")
    print(f"  tune {number} ({tune['tune_s']:.0f} s): pick {describe(tune['pick'])}\n"
          f"    tool: baseline {tune['baseline_samples_per_s'] or 0:.0f}/s, pick expected "
          f"{tune['expected_samples_per_s'] or 0:.0f}/s, {claim}\n"
          f"    plain: {verified}{ratio}", flush=True)


def grid_points(name: str, quick: bool, picks: list[int]) -> list[int]:
    base = GRID_QUICK if quick else (GRID_LATENCY if name in LATENCY_LIKE else GRID)
    return sorted(set(base) | set(picks))


def grid(target: str, points: list[int], args) -> dict[int, float]:
    """4.: plain samples/s by num_workers, passes in alternating order, the median per point."""
    rates: dict[int, list[float]] = {n: [] for n in points}
    for pass_no in range(args.passes):
        for n in (points if pass_no % 2 == 0 else points[::-1]):
            rates[n].append(plain(target, args.seconds, workers_overrides(n))["samples_per_s"])
        print(f"  grid pass {pass_no + 1}: " + ", ".join(
            f"{n}:{rates[n][-1]:.0f}" for n in points), flush=True)
    return {n: statistics.median(v) for n, v in rates.items()}


# -- one module, the table ------------------------------------------------------------------

def bench_module(name: str, args) -> dict:
    target = os.path.join(ROOT, "tests", "real", f"{name}.py")
    module, _ = load_module(target)
    own = own_settings(module)
    row = {"module": name, "own": own, "train_step": callable(getattr(module, "train_step", None)),
           "samples_per_batch": module.EXPECTED.get("samples_per_batch")}
    print(f"\n== {name} ({describe(own)}{', train_step' if row['train_step'] else ''})",
          flush=True)
    try:
        row["profile"] = reported_vs_plain(target, row["samples_per_batch"], args)
        row["tunes"] = []
        for number in range(1, args.repeats + 1):
            row["tunes"].append(tune_and_verify(target, own, args))
            print_tune(number, row["tunes"][-1])
        picks = [t["pick"]["num_workers"] for t in row["tunes"]]
        rates = grid(target, grid_points(name, args.quick, picks), args)
        best = max(rates, key=rates.get)
        row["grid"], row["grid_best"] = rates, best
        for tune in row["tunes"]:
            tune["pick_score"] = rates[tune["pick"]["num_workers"]] / rates[best]
        print("  grid median: " + ", ".join(f"{n}:{r:.0f}" for n, r in rates.items())
              + f"; best {best}; picks {picks} score "
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
    pick = mark(f"{tune['pick']['num_workers']:4d}", stable)
    return (f"  {number:3d} {pick} {claimed:>12s} {tune['verified']:8.2f}x "
            f"{ratio_text:>10s} {score_text:>10s}")


def table_lines(row: dict) -> list[str]:
    """The row's summary lines: the profile figures, then one line per tune (repeat)."""
    head = f"{row['module'] + ('*' if row['train_step'] else ''):19s} "
    if "profile" not in row:
        return [head + f"FAILED: {row.get('error')}"]
    head += profile_cells(row)
    tunes = row.get("tunes", [])
    stable = len({t["pick"]["num_workers"] for t in tunes}) <= 1
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
            out.append(f"{row['module']}*: has a train_step; rates are load-only (plain_rate), the "
                       "tuner's claim includes the step and its pick keeps the step fed, so "
                       "claim/ver and pick/best are on load rates, not the step's idle")
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
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--pairs", type=int, help="interleaved pairs per comparison (3)")
    parser.add_argument("--repeats", type=int, help="tunes per module (3)")
    parser.add_argument("--passes", type=int, help="grid passes (3)")
    parser.add_argument("--budget-s", type=float, default=45.0, help="the tuner's budget")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1 pair, 1 repeat, 1 grid pass over 0, 2, 4 and the "
                             "pick, unless given")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args()
    default = 1 if args.quick else 3
    for name in ("pairs", "repeats", "passes"):
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def main() -> None:
    args = parse_args()
    names = [n for n in MODULES if not args.only or args.only in n]
    if not names:
        raise SystemExit(f"no module matches {args.only!r}; modules: {', '.join(MODULES)}")
    print(f"{len(names)} module(s); {args.seconds:g} s per measurement, {args.pairs} pair(s), "
          f"{args.repeats} tune(s) of {args.budget_s:g} s, {args.passes} grid pass(es)")
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
