"""Whether delivering batches out of order pays: with ``in_order=False`` (torch >= 2.6) the loop
takes each batch as soon as its worker has made it, so one slow sample no longer holds back the
batches other workers made after it.

NOTE [ Out-of-order delivery ]

    Tried only where it can pay and the job allows it: the pick has 2 or more workers, their
    per-batch times have a heavy tail (a coefficient of variation of at least HEAVY_TAIL_CV; one
    sample in 20 taking 80 times the others gives 2.1), the loop waits for its batches (no
    consumer, or one idle at least WAITS_MIN of its time), torch has the setting, and the user
    did not ask to keep the order (``tune --keep-order``, the page's "Keep batches in order").
    Then the pick is measured in order and out of order in turn (A B, B A), and in_order=False
    is recommended only when faster by MIN_GAIN and beyond both sides' noise. On
    tests/datasets/tail_heavy.py (one sample in 200 takes 0.4 s, the rest 0.5 ms) plain loops
    measured out of order at 1.7x in order with 2 workers and 2.5x with 4; where a deeper
    prefetch already absorbs a lighter tail (one in 20 taking 40 ms), it measured alike.

    What it changes for the job: each epoch still yields every sample once, but batches come
    in the order workers finish them, not the order the sampler drew them; a job whose batches
    must follow the sampler (curriculum order, a resumable position within an epoch) keeps it.
"""

from __future__ import annotations

import statistics

from dataloader_tuner.config import LoaderConfig, supports_in_order
from dataloader_tuner.record.trials import TrialResult
from dataloader_tuner.tune.claim import in_turn

HEAVY_TAIL_CV = 1.0
WAITS_MIN = 0.02
MIN_GAIN = 1.03
KEEP_ORDER_HINT = ("batches then come in the order workers finish them, not the sampler's "
                   "(each epoch still has every sample once): if your training needs the "
                   "sampler's order, keep in_order=True (tune --keep-order)")


def worth_trying(pick: list[TrialResult], final: LoaderConfig, keep_order: bool,
                 torch_version: str) -> tuple[bool, str | None]:
    """(whether to measure in_order=False for the pick, a reason line to show when it is not
    tried although its batches' tail says it could pay)."""
    if final.num_workers < 2 or not final.in_order or not pick:
        return False, None
    spreads = [t.worker_ms_cv for t in pick if t.worker_ms_cv is not None]
    idle = [t.consumer_idle_frac for t in pick if t.consumer_idle_frac is not None]
    spread = statistics.median(spreads) if spreads else 0.0
    if spread < HEAVY_TAIL_CV or (idle and statistics.median(idle) < WAITS_MIN):
        return False, None
    tail = (f"the workers' batch times have a heavy tail (coefficient of variation "
            f"{spread:.1f}), so slow batches hold back those made after them")
    if keep_order:
        return False, f"in_order=False was not tried: {tail}, but you asked to keep the order."
    if not supports_in_order(torch_version):
        return False, (f"in_order=False could pay here ({tail}), but torch {torch_version} does "
                       "not have it (torch 2.6 or later does).")
    return True, None


def decide(ordered: list[TrialResult | None], unordered: list[TrialResult | None]
           ) -> tuple[bool, str]:
    """(recommend in_order=False, the reason line), from the pick measured both ways in turn."""
    both = in_turn(ordered, unordered)
    if both is None:
        return False, ("in_order=False was measured but a trial reached no steady state: "
                       "batches stay in order.")
    figures = (f"{both.rate_b:.0f} samples/s out of order against {both.rate_a:.0f} in order "
               f"({len(both.b)} trials each, in turn{both.noise_text()})")
    if both.b_pays(MIN_GAIN):
        return True, (f"in_order=False: {figures}: a slow batch no longer holds back the ones "
                      f"made after it. Note: {KEEP_ORDER_HINT}.")
    return False, f"in_order=False was measured and did not pay beyond its noise: {figures}."
