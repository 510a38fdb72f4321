"""Typed errors the engine reports to users.

Every failure the user can cause (a bad target, bad settings, a dataset that raises) becomes an
``EngineError`` with a one-line headline naming the problem and the fix, plus details (usually
the user's own traceback). They cross process boundaries as plain dicts (``to_dict``), never as
strings to parse: ``to_dict`` names the class (``category``) so ``from_dict`` rebuilds a
TargetError as a TargetError in the parent, and ``type`` is one of ERROR_CODES.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineError(Exception):
    """A failure with a user-facing headline. ``type`` is a stable code for programs."""

    message: str
    details: str = ""
    type: str = "engine_error"

    def __str__(self) -> str:
        return self.message

    category = "engine"  # which class: kept across the pipe (from_dict)

    def to_dict(self) -> dict:
        return {"type": self.type, "message": self.message, "details": self.details,
                "category": self.category}

    @classmethod
    def from_dict(cls, data: dict) -> "EngineError":
        """The error ``to_dict`` described, as its own class (EngineError if unknown)."""
        error_cls = next((c for c in ERROR_CLASSES if c.category == data.get("category")),
                         EngineError)
        # (.get: an older document, or a watched job's end, may carry the message alone)
        return error_cls(message=data.get("message", ""), details=data.get("details") or "",
                         type=data.get("type") or "engine_error")


class TargetError(EngineError):
    """The dataset target could not be turned into a Dataset."""

    category = "target"


class ConfigError(EngineError):
    """Loader settings that DataLoader itself would reject (or that make no sense)."""

    category = "config"


class RunError(EngineError):
    """The user's dataset, collate function or train step failed while the loader ran."""

    category = "run"


ERROR_CLASSES = (EngineError, TargetError, ConfigError, RunError)

# Every ``type`` an error can carry, for programs that read --json (a test keeps it complete).
ERROR_CODES = {
    "engine_error": "an engine failure with no more specific code",
    "engine_internal": "a bug in the engine itself (please report it)",
    "engine_crashed": "the engine's process ended without reporting why",
    # the target
    "target_syntax_error": "the target is not path.py[:attr] or pkg.module[:attr]",
    "target_not_found": "no such file or module",
    "target_import_error": "importing the module raised",
    "target_attr_missing": "the module has no such attribute",
    "target_ambiguous": "several Dataset candidates and none named",
    "target_no_dataset": "nothing in the module looks like a Dataset",
    "target_not_dataset": "the attribute is not something DataLoader can load",
    "target_bad_arguments": "a factory's arguments are not Python literals",
    "target_factory_error": "calling the dataset factory (or sampler/collate factory) raised",
    "target_empty": "the dataset has no samples",
    "inspect_timeout": "loading the module took too long (the dashboard's check)",
    # the settings
    "invalid_settings": "DataLoader settings it would reject",
    # the run
    "getitem_error": "reading a sample raised",
    "dataset_error": "the dataset raised while the loader ran",
    "collate_shapes": "collate failed on samples of different shapes",
    "empty_dataset": "the loader produced no batches",
    "train_step_error": "the module's train_step raised",
    "worker_error": "a DataLoader worker raised",
    "worker_exited": "a DataLoader worker exited unexpectedly",
    "worker_killed": "a DataLoader worker was killed by a signal (often out of memory)",
    "shm_full": "/dev/shm ran out of space for batches in flight",
    "too_many_open_files": "the process ran out of file descriptors",
    "not_picklable": "the dataset or collate cannot be sent to spawn/forkserver workers",
    "cuda_in_fork": "CUDA was initialised before forking workers",
    "hang": "no batch arrived within the timeout",
    "no_steady_state": "no tune trial ran long enough to be measured",
    "companion_failed": "a loader run as another rank of the node (--local-world-size) failed",
    "tune_incomplete": "the tuner stopped before reaching a recommendation",
    # a watched training job (dataloader_tuner.watch)
    "watched_job_failed": "the training script being watched ended with an exception",
}
