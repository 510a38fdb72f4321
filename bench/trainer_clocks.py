"""Does the headline wait agree with each trainer's own clock? The figures side by side.

Each training script of tests/trainers/ runs as a job would (a fresh process, watched in its one
line) and prints its own clock of the wait beside the tool's (issue 66):

- pytorch/examples' imagenet ``train()`` (its ``data_time`` / ``batch_time`` meters, JPEGs at
  batch 32, 2 workers and 0): the share of the loop, each side's own;
- Lightning (``profiler="simple"``'s ``train_dataloader_next``, plus each epoch's ``iter()`` of
  its fetcher, which that profiler does not time), 2 workers restarted and persistent;
- the Hugging Face Trainer (``next()`` on its epoch iterator in ``get_batch_samples``; the epoch's
  ``iter()`` is inside the first: accelerate's shard is a generator);
- accelerate without the Trainer (the loop's own ``next()`` on the prepared shard, each epoch's
  ``iter()`` included).

Prints, per case, the trainer's clock, the tool's, and their ratio. A run is one sample of a
noisy 2-core machine; run it twice before reading a few percent into it.

    ../shared/tools/capped 6 -- python bench/trainer_clocks.py [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dataloader_tuner import RunStore  # noqa: E402


def script(name: str, *args: str) -> dict[str, Any]:
    """The last JSON line the training script printed."""
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "trainers", name), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1"))
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])


def imagenet(db: str, workers: str) -> tuple[str, float, float]:
    doc = script("imagenet_train.py", db, workers)
    return "share of the loop (data_time / batch_time)", doc["own_share"], doc["share"]


def lightning(db: str, *flags: str) -> tuple[str, float, float]:
    doc = script("lightning_clock.py", db, *flags)
    return ("train_dataloader_next + the fetcher's iter(), s", sum(doc["lightning_s"])
            + sum(doc["iters_s"]), sum(doc["tool_s"]))


def hugging_face(db: str, *flags: str) -> tuple[str, float, float]:
    with tempfile.TemporaryDirectory() as out:
        doc = script("hf_clock.py", db, out, *flags)
    return "next() in get_batch_samples, s", sum(doc["fetches_s"]), sum(doc["tool_s"])


def accelerate(db: str, *flags: str) -> tuple[str, float, float]:
    doc = script("accelerate_loop.py", db, *flags)
    run = next(r for r in RunStore(db).list_runs() if r.label == "train")
    return ("the loop's next() on the shard, s", doc["waited_s"],
            run.result.to_dict()["input_wait"]["waited_s"])


CASES: dict[str, Callable[[str], tuple[str, float, float]]] = {
    "imagenet train(), 2 workers": lambda db: imagenet(db, "2"),
    "imagenet train(), 0 workers": lambda db: imagenet(db, "0"),
    "Lightning, restarted": lambda db: lightning(db),
    "Lightning, persistent": lambda db: lightning(db, "--persistent"),
    "HF Trainer, restarted": lambda db: hugging_face(db),
    "HF Trainer, persistent": lambda db: hugging_face(db, "--persistent"),
    "accelerate, restarted": lambda db: accelerate(db),
    "accelerate, persistent": lambda db: accelerate(db, "--persistent"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="the cases whose name contains this")
    args = parser.parse_args()
    print(f"{'case':30} {'the trainer clock':48} {'its own':>9} {'the tool':>9} {'ratio':>6}")
    for name, case in CASES.items():
        if args.only and args.only.lower() not in name.lower():
            continue
        with tempfile.TemporaryDirectory() as tmp:
            clock, own, tool = case(os.path.join(tmp, "runs.db"))
        print(f"{name:30} {clock:48} {own:9.4f} {tool:9.4f} {tool / own:6.3f}", flush=True)


if __name__ == "__main__":
    main()
