"""The time a tune may take: the user's hard limit, the at most the tune announced, and the time
it aims at without a limit (plan.py's NOTE [ A tune's aim ]), kept on an injectable clock.

NOTE [ A count cut at the user's limit ]

    Under --budget-s the counts the tune must see share what is left (TimeLimit.share), each
    cut at its share, so a probe of ~1.4 s batches ends after ~12 steady batches, not its 20.
    The count the model predicts was held to its whole trial instead: with --budget-s 60 on
    audio features at 1.4 s a batch (a CPU step), the probes took 20 s and 19 s, the 22 s left
    were under 2 workers' whole estimate, and the tune picked 1 worker, 0.76x the module's own
    in plain loops, never measuring the predicted 2. A count the tune must see now starts
    where its warm-up and CUT_STEADY steady batches fit, cut at the limit as the probes are.

NOTE [ An at most that holds ]

    The "at most" is a promise, not a second estimate: ImageFolder at batch 256 was announced
    at most 393 s and took 405 s, audio 302 s and took 359 s (issue 62), the time going to
    what the plan counted loosely (the checks after the search, trials cut late). So the first
    at most announced is a ceiling the tune keeps as it keeps the user's limit: every trial
    starts only where its estimate fits before it, and is cut at it, less the batch a cut
    waits for and STOP_S to stop the workers (TimeLimit.promise). A later plan may lower the
    at most, never raise it; a pick the ceiling cut short says so in its first line.
"""

from __future__ import annotations

import time
from typing import Callable

STOP_S = 1.0  # a trial's workers stopped after it was cut (NOTE [ An at most that holds ])


class TimeLimit:
    """The user's hard limit on a tune's seconds (None: no limit), the "at most" the tune
    announced (NOTE [ An at most that holds ]) and, without a limit, the time it aims at (NOTE
    [ A tune's aim ]), on an injectable clock."""

    def __init__(self, budget_s: float | None, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.budget_s, self.clock = budget_s, clock
        self.started = clock()
        self.reached = False  # a trial was left out (or cut) for want of time
        self.promised_s: float | None = None  # the at most announced, once it was
        self._promised_end: float | None = None  # where the search ends to keep it
        self.aim_s: float | None = None  # the time aimed at, without a user's limit
        self.claim_reserve_s = 0.0  # of the aim, kept for the end's claim until it starts
        self.aimed = False  # a trial was left out for the aim (not a limit: no cut said)

    def aim(self, aim_s: float, claim_reserve_s: float) -> None:
        """NOTE [ A tune's aim ]: aim at ``aim_s``, keeping ``claim_reserve_s`` of it for the
        end's claim; ignored under a user's limit, which is the aim then."""
        if self.budget_s is None:
            self.aim_s, self.claim_reserve_s = aim_s, claim_reserve_s

    def claiming(self) -> None:
        """The end's claim starts: the time kept for it is its to spend."""
        self.claim_reserve_s = 0.0

    def aim_left(self) -> float | None:
        """What is left of the user's limit, or else of the aim less the claim's reserve (None:
        neither set): the time the search's trials share."""
        if self.budget_s is not None:
            return self.budget_left()
        if self.aim_s is None:
            return None
        return max(self.aim_s - self.claim_reserve_s - self.spent(), 0.0)

    def promise(self, at_most_s: float, last_batch_s: float) -> float:
        """The tune announces ``at_most_s``: from now on the search ends ``last_batch_s`` and
        STOP_S before it (a trial is cut after a batch, then its workers are stopped), as it
        would at the user's limit. The first promise holds: a later one only lowers it.
        Returns the at most to announce."""
        if self.budget_s is not None:
            at_most_s = min(at_most_s, self.budget_s)
        if self.promised_s is not None:
            at_most_s = min(at_most_s, self.promised_s)
        self.promised_s = at_most_s
        self._promised_end = at_most_s - last_batch_s - STOP_S
        return at_most_s

    @property
    def by_promise(self) -> bool:
        """The limit reached is the announced at most, not the user's."""
        promised = self.promised_s
        return self.reached and promised is not None and (self.budget_s is None
                                                          or promised < self.budget_s)

    def spent(self) -> float:
        return self.clock() - self.started

    def left(self) -> float | None:
        """Seconds left, or None without a limit."""
        ends = [end for end in (self.budget_s, self._promised_end) if end is not None]
        return None if not ends else max(min(ends) - self.spent(), 0.0)

    def share(self, counts: int) -> float | None:
        """Under the user's limit, what one trial of ``counts`` the tune must still see may
        take (None: no limit): the time left split between them, so the count the search
        predicts is measured, not cut off by probes run to their caps (with --budget-s 60 on
        ImageNet-style JPEGs, the probes of 0 and 1 worker took 26 s and 32 s, and the tune
        picked 0 workers, about half the best's rate)."""
        left = self.aim_left()
        return None if left is None else left / max(counts, 1)

    def budget_left(self) -> float | None:
        """What the user's own limit leaves (None: none set); the at most announced aside."""
        return None if self.budget_s is None else self.left()

    def fits(self, estimated_s: float, must: bool = False) -> bool:
        """Whether a trial estimated at ``estimated_s`` may start; notes when it may not.
        ``must``: a trial the tune cannot do without (a count it must see, the claim's first
        pair), which only a limit stops, not the aim."""
        left = self.left()
        if left is not None and not (estimated_s <= left and left > 0):
            self.reached = True
            return False
        aim_left = None if must or self.budget_s is not None else self.aim_left()
        if aim_left is not None and (estimated_s > aim_left or aim_left <= 0):
            self.aimed = True
            return False
        return True
