"""What a side check of the offline search decided: one shape for the freed-memory check
(heap_check.py) and the threads check (thread_pools.py). Each is decided once, at the first
trial that can tell; the trials it measured besides the search's are set aside (shown, not
searched); and the pick carries its setting, with the reason, where the pick's trials ran
with it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from dataloader_tuner.record.trials import TrialResult
from dataloader_tuner.tune.recommend import Recommendation

# A check's setting is kept where it is faster by this much, beyond both sides' noise
MIN_GAIN = 1.03


@dataclass
class SideDecision:
    """The state every side check keeps; ``recommend`` is each check's own."""

    reason: str | None = None  # the pick's line where the setting is kept (or why it is not)
    decided: bool = False
    others: list[TrialResult] = field(default_factory=list)  # its trials the search does not keep

    def set_aside(self, trial: TrialResult, report: Callable[[TrialResult], None]) -> None:
        """One of its trials shown, not searched."""
        self.others.append(trial)
        report(trial)

    def recommend(self, recommendation: Recommendation, pick: list[TrialResult]
                  ) -> Recommendation:
        """The recommendation with this check's setting, where ``pick`` (the pick's trials)
        ran with it."""
        raise NotImplementedError


def carried(decisions: Iterable[SideDecision], recommendation: Recommendation,
            pick: list[TrialResult]) -> Recommendation:
    """The pick with every check's setting, in the order the checks are given."""
    for decision in decisions:
        recommendation = decision.recommend(recommendation, pick)
    return recommendation
