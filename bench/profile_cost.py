"""What does sampling where the time goes cost a profile? The same real profile run (engine child,
real workers) with the stack sampler on and off, in turns (A B, B A, ...), per case; the median
of the per-pair ratios of the reported samples/s (target >= 0.99: at most 1%), and the looks the
sampled run rests on.

Cases: the fastest batches (long_tail at 0 workers: ~65 us batches, the sampler's handler in
the loop's own process), deep stacks at 0 workers (detectron2_style's deep copies: its looks
are the dearest, spaced out by the sampler's budget), JPEG decoding in 2 persistent workers
(jpeg_folder), and the known make-up dataset in 2 workers (tests/datasets/known_stages.py).

    ../shared/tools/capped 8 -- python bench/profile_cost.py [--pairs 5] [--seconds 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dataloader_tuner.run.runner import RunRequest, run_to_completion  # noqa: E402

CASES = [
    ("long_tail, 0 workers", "tests/real/long_tail.py", {"num_workers": 0}),
    ("detectron2_style, 0 workers", "tests/real/detectron2_style.py", {"num_workers": 0}),
    ("jpeg_folder, 2 persistent", "tests/real/jpeg_folder.py",
     {"num_workers": 2, "persistent_workers": True}),
    ("known_stages, 2 workers", "tests/datasets/known_stages.py", {"num_workers": 2}),
]


def rate(target: str, settings: dict, seconds: float, stacks: bool) -> tuple[float, int]:
    handle = run_to_completion(RunRequest(target=os.path.join(ROOT, target), seconds=seconds,
                                          settings=settings, sample_stacks=stacks))
    result = handle.live.profile_result(handle.state.value)
    if result.status != "ok" or result.samples_per_s is None:
        raise SystemExit(f"{target}: {result.error_message}")
    looks = (result.stacks_sampled or {}).get("looks", 0)
    return result.samples_per_s, looks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    print(f"{'case':28s} {'on/off':>7s} {'pairs':>24s} {'looks':>6s}")
    for name, target, settings in CASES:
        ratios, looks = [], []
        for pair in range(args.pairs):
            order = (True, False) if pair % 2 == 0 else (False, True)
            got = {stacks: rate(target, settings, args.seconds, stacks) for stacks in order}
            ratios.append(got[True][0] / got[False][0])
            looks.append(got[True][1])
        spread = f"{min(ratios):.3f}-{max(ratios):.3f}"
        mark = " " if statistics.median(ratios) >= 0.99 else "!"
        print(f"{name:28s} {statistics.median(ratios):6.3f}{mark} {spread:>24s} "
              f"{int(statistics.median(looks)):6d}", flush=True)


if __name__ == "__main__":
    main()
