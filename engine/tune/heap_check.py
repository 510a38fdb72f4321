"""Whether each worker should keep the memory it frees, decided once in the offline search
(NOTE [ Memory a worker frees ], instrument/heap.py).

NOTE [ Deciding freed memory during the search ]

    A worker is fast or slow by what its parent process had freed when it forked, so the
    tune's own process (which has loaded batches itself by its first trial with workers) is
    no witness of a training script's first epoch. The first trial with workers runs with
    KeepFreedMemory; it is then measured once more without it in workers started fresh
    (multiprocessing_context="spawn": a heap that has freed nothing, as a script's before its
    first epoch), for FAULT_BATCHES past its warm-up (plan.py): what it is read for is the
    pages its worker faults in a batch, not its rate. KeepFreedMemory is kept where the fresh
    workers faulted in pages enough to cost MIN_GAIN of a batch (at FAULT_S a page) and at
    least FAULTS_RATIO times as many as with it, or (where a fresh trial ran long enough to
    believe its rate) when faster by MIN_GAIN beyond both sides' noise; not where the fresh
    rate was faster beyond it. A rate read once on each side was ±20-30% from one process to
    the next on a busy 2-core machine, the faults 134,000 against 720 a batch every time
    (audio_mel); a tune that read the rates alone kept nothing there and picked persistent
    workers that ran at 0.71 of the grid's best in a fresh process; the fresh trial at its 20
    steady batches took 23 s of a 108 s tune there. Every later trial runs with it: the search
    then measures what the job will run, and its rates no longer depend on the order of the
    trials. Otherwise later trials run without it. Where spawn cannot start the dataset (a
    class that does not pickle), or the C library is not glibc, nothing is decided and nothing
    is kept. Where the user's time limit leaves less than the fresh trial and one more like
    the first (for the count the search predicts, which matters more), nothing is measured,
    nothing is kept, and the pick says so: with --budget-s 60 on ImageNet-style JPEGs (~1.3
    s a batch), the check (then a whole trial) took the 16 s the predicted 2 workers needed,
    and the tune picked 0 workers, about half the best's rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from dataloader_tuner.instrument.heap import is_glibc
from dataloader_tuner.record.trials import TrialResult
from dataloader_tuner.tune.claim import in_turn
from dataloader_tuner.tune.plan import fresh_check_seconds
from dataloader_tuner.tune.recommend import Recommendation
from dataloader_tuner.tune.side_check import MIN_GAIN, SideDecision

FAULTS_RATIO = 2.0
# a page faulted in and zeroed, at least: audio_mel's 133,000 more a batch cost its workers
# ~0.29 s a batch (2 workers, 2 cores), ~2 us each
FAULT_S = 1e-6
SKIPPED_REASON = ("Not measured in the time this tune had: whether each worker should keep the "
                  "memory it frees (worker_init_fn=dataloader_tuner.KeepFreedMemory()); a longer "
                  "--budget-s measures it.")
FRESH_PHASE = "heap_fresh"


@dataclass
class HeapDecision(SideDecision):
    """The search's freed-memory setting (NOTE [ Deciding freed memory during the search ])."""

    available: bool = field(default_factory=is_glibc)
    keep: bool = False  # what later trials run with
    skipped: bool = False  # not measured: the user's time limit left too little

    @property
    def first_keeps(self) -> bool:
        """The next trial with workers runs with KeepFreedMemory: to decide, or as decided."""
        return self.available and (self.keep or not self.decided)

    def check(self, first: TrialResult, measure_fresh: Callable[[], TrialResult | None],
              report: Callable[[TrialResult], None], time_left_s: float | None = None
              ) -> TrialResult:
        """``first``, a search trial with workers run with KeepFreedMemory while undecided;
        ``measure_fresh()`` runs its settings without it in spawned workers; ``time_left_s``:
        what the user's limit leaves (None: no limit)."""
        if self.decided or not self.available or not first.num_workers:
            return first
        self.decided = True
        if time_left_s is not None and time_left_s < first.seconds + fresh_check_seconds(
                first.ms_per_batch / 1000.0):
            self.skipped = True  # (see the NOTE: the search's own counts come first)
            return first
        try:
            fresh = measure_fresh()
        except Exception:  # noqa: BLE001 - spawn cannot start every dataset: nothing is kept
            return first
        if fresh is not None:
            self.set_aside(replace(fresh, phase=FRESH_PHASE), report)
        self.keep, self.reason = decide(fresh, first)
        return first

    def recommend(self, recommendation: Recommendation, pick: list[TrialResult]
                  ) -> Recommendation:
        """The setting where the pick's trials ran with it and it was kept, with the reason."""
        kwargs = dict(recommendation.kwargs)
        if kwargs.get("num_workers") and self.skipped:
            return replace(recommendation, reasons=recommendation.reasons + (SKIPPED_REASON,))
        if not kwargs.get("num_workers") or not self.keep:
            return recommendation
        if not pick or not all(t.keep_freed_memory for t in pick):
            return recommendation
        kwargs["keep_freed_memory"] = True
        reasons = recommendation.reasons + ((self.reason,) if self.reason else ())
        return replace(recommendation, kwargs=kwargs, reasons=reasons)


def decide(fresh: TrialResult | None, kept: TrialResult) -> tuple[bool, str | None]:
    """(keep the memory each worker frees, the reason line)."""
    both = in_turn([fresh], [kept])
    if both is None or fresh is None:
        return False, None
    workers = kept.num_workers
    figures = (f"{both.rate_b:.0f} samples/s with it against {both.rate_a:.0f} in workers "
               f"started fresh, as a training script's are before its first epoch (at "
               f"{workers} worker{'s' if workers != 1 else ''}{both.noise_text()})")
    faulting = faults_cost(fresh, kept)
    if faulting:
        figures += (f"; those faulted in {fresh.worker_faults:,.0f} pages a batch against "
                    f"{kept.worker_faults:,.0f} with it")
    faster_fresh = (fresh.conclusive and both.noise is not None and both.rate_a > both.rate_b
                    and both.rate_a / both.rate_b - 1 > both.noise)
    if both.b_pays(MIN_GAIN) or (faulting and not faster_fresh):
        return True, (f"worker_init_fn=dataloader_tuner.KeepFreedMemory(): each worker keeps "
                      f"the memory it frees for its next batch instead of faulting it in again: "
                      f"{figures}. Without it your workers are this slow or not by what your "
                      "process freed before they started; persistent workers keep that for the "
                      "whole run. The search went on with it.")
    return False, None


def faults_cost(fresh: TrialResult, kept: TrialResult) -> bool:
    """Whether the fresh workers faulted in pages enough to cost MIN_GAIN of a batch, and
    FAULTS_RATIO times the kept workers' (see the NOTE); False where either was not read."""
    if fresh.worker_faults is None or kept.worker_faults is None or not kept.worker_ms:
        return False
    excess_s = (fresh.worker_faults - kept.worker_faults) * FAULT_S
    return (fresh.worker_faults >= FAULTS_RATIO * kept.worker_faults
            and excess_s >= (MIN_GAIN - 1) * kept.worker_ms / 1000)
