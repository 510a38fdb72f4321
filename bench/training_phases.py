"""Where does a watched training's extra time go? The plain loop of bench/trainer_overhead.py,
watched and not, in turns, timed by phase.

Each training (3 epochs x 96 batches, 2 workers restarted each epoch, a sample taking 0.5 ms, a
~10 ms step) is timed from before ``watch()`` to after its runs end, and each epoch by phase:
``iter()`` (its workers forked), its first batch, its other batches' waits, the last ``next()``
(its workers shut down), its steps. Printed per phase: the median of the paired differences,
watched minus the plain training next to it, in ms. Their sum is compared with the trainings'
own difference: what the phases do not account for is cost nobody traced.

    ../shared/tools/capped 6 -- python bench/training_phases.py [--rounds 40] [--epochs 3]
        [--batches 96]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from trainer_overhead import STEP_S, samples_loader

EPOCHS, BATCHES = 3, 96


def training(watched: bool, db: str) -> dict[str, float]:
    """One training; seconds of each phase (keys like ``other waits 1``: the second epoch's)."""
    import torch

    import dataloader_tuner
    from dataloader_tuner.watcher.shutdown import _end_all

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    now = time.monotonic
    phases: dict[str, float] = {}
    started = now()
    loader = samples_loader(BATCHES)
    batches = dataloader_tuner.watch(loader, db=db) if watched else loader
    phases["watch()"] = now() - started
    for epoch in range(EPOCHS):
        t_iter = now()
        iterator = iter(batches)
        t_first = now()
        x, y = next(iterator)
        phases[f"iter() {epoch}"] = t_first - t_iter
        phases[f"first batch {epoch}"] = now() - t_first
        waits = steps = 0.0
        while True:
            t_step = now()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            time.sleep(STEP_S)  # the rest of the step, on the GPU
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            t_ask = now()
            steps += t_ask - t_step
            try:
                x, y = next(iterator)
            except StopIteration:
                phases[f"last next() {epoch}"] = now() - t_ask
                break
            waits += now() - t_ask
        phases[f"other waits {epoch}"] = waits
        phases[f"steps {epoch}"] = steps
    t_end = now()
    _end_all()  # the runs' end (a script's happens at exit)
    phases["runs' end"] = now() - t_end
    phases["training"] = now() - started
    return phases


def main() -> None:
    global EPOCHS, BATCHES
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--batches", type=int, default=BATCHES,
                        help="per epoch: whether a difference grows with it (paid per batch)")
    args = parser.parse_args()
    EPOCHS, BATCHES = args.epochs, args.batches
    import torch

    torch.set_num_threads(1)  # as bench/trainer_overhead.py: the workers get the other core
    plain: list[dict[str, float]] = []
    watched: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as folder:
        db = os.path.join(folder, "runs.sqlite")
        training(False, db)  # warm-up, one of each
        training(True, db)
        for round_ in range(args.rounds):
            for is_watched in ([False, True] if round_ % 2 == 0 else [True, False]):
                (watched if is_watched else plain).append(training(is_watched, db))
    print(f"{EPOCHS} epochs x {BATCHES} batches, {args.rounds} rounds; per phase, median of "
          "watched minus plain (paired), ms")
    accounted = 0.0
    for phase in plain[0]:
        difference = 1000 * statistics.median(w[phase] - p[phase]
                                              for w, p in zip(watched, plain))
        typical = 1000 * statistics.median(p[phase] for p in plain)
        print(f"  {phase:<16} {difference:+7.2f}   (plain {typical:8.2f})")
        if phase != "training":
            accounted += difference
    print(f"  phases summed    {accounted:+7.2f}")


if __name__ == "__main__":
    main()
