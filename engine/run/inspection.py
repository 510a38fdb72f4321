"""A target checked without a run: what it resolves to (its dataset card, the settings a run
would start from), in a short-lived engine child; nothing is saved in the run history."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dataloader_tuner.errors import TargetError
from dataloader_tuner.protocol import RunRequest
from dataloader_tuner.record.cards import Consumer, DatasetCard
from dataloader_tuner.run.runner import RunHandle

INSPECT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Inspection:
    """What a target resolves to: its dataset card and the settings a run would start from,
    or the error that stopped it (the dashboard's card, ``dataloader-tuner inspect``)."""

    dataset: DatasetCard | None = None
    config: dict[str, Any] | None = None  # LoaderConfig.to_json_dict of the module's settings
    consumer: Consumer | None = None
    system: dict[str, Any] | None = None
    error: dict[str, Any] | None = None  # EngineError.to_dict(): set when it failed

    @property
    def ok(self) -> bool:
        return self.error is None and self.dataset is not None

    def to_dict(self) -> dict[str, Any]:
        if not self.ok:
            return {"status": "error", "error": self.error}
        return {"status": "ok", "dataset": self.dataset.to_dict() if self.dataset else None,
                "config": self.config,
                "consumer": self.consumer.to_dict() if self.consumer else None,
                "system": self.system}


def inspect_target(target: str, timeout_s: float = INSPECT_TIMEOUT_S) -> Inspection:
    """What a target resolves to, checked in a short-lived child (importing the user's module
    may crash, hang or print). Nothing is saved in the run history."""
    handle = RunHandle(RunRequest(target=target, kind="inspect", seconds=0)).start()
    try:
        handle.wait(timeout_s)
    finally:
        handle.close()
    live = handle.live
    if live.error is not None:
        return Inspection(error=live.error.to_dict())
    if live.dataset is None:
        return Inspection(error=TargetError(
            f"Loading the module took longer than {timeout_s:g} s. "
            "Does it download or read a lot at import time?",
            details=handle.output_tail(), type="inspect_timeout").to_dict())
    return Inspection(live.dataset, live.config, live.consumer,
                      live.system.to_dict() if live.system is not None else None)
