"""What an in-place search chose, as a tune's result and a settings file: the same document
``tune --out`` writes, so ``dataloader_tuner.load_settings`` reads either."""

from __future__ import annotations

import json
from typing import Any, Callable

from dataloader_tuner.access import open_private
from dataloader_tuner.analyse.results import TuneResult
from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.settings import settings_file
from dataloader_tuner.tune.in_place import Search


def chosen_kwargs(search: Search, pin_memory: bool, persistent_workers: bool) -> dict[str, Any]:
    """DataLoader's keyword arguments for the search's choice (the job's own where it measured
    none): the count and prefetch it chose, the job's own ``pin_memory`` and
    ``persistent_workers`` (the search does not change those)."""
    best = search.best
    chosen = best.setting if best is not None else search.baseline
    return {"num_workers": chosen.num_workers, "pin_memory": pin_memory,
            "prefetch_factor": chosen.prefetch_factor if chosen.num_workers else None,
            "persistent_workers": bool(persistent_workers and chosen.num_workers)}


def choice_result(search: Search, config: LoaderConfig, target: str,
                  snippet: Callable[[LoaderConfig], str]) -> TuneResult:
    """The choice as a TuneResult: its rate and interval where it was measured, each of the
    search's verdicts as a reason."""
    recommended = chosen_kwargs(search, bool(config.pin_memory), bool(config.persistent_workers))
    best = search.best
    interval = best.interval() if best is not None else None
    return TuneResult(
        status="ok", target=target, recommended=recommended,
        snippet=snippet(config.replace(**recommended)),
        expected_samples_per_s=best.samples_per_s if best is not None else None,
        uncertainty_pct=100 * interval if interval else None,
        baseline={"source": "the job's own settings", **search.baseline.workers_and_prefetch()},
        reasons=tuple(d.verdict for d in search.decisions))


def save_choice(result: TuneResult, path: str) -> str:
    """Write the settings file; says where it went, or why not (never raises: the job goes on
    with the choice either way)."""
    try:
        with open_private(path) as f:
            json.dump(settings_file(result), f, indent=2)
    except OSError as exc:
        return f"not saved ({exc})"
    return f"saved to {path}"
