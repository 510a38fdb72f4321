"""Typed errors the engine reports to users.

Every failure the user can cause (a bad target, bad settings, a dataset that raises) becomes an
``EngineError`` with a one-line headline naming the problem and the fix, plus details (usually
the user's own traceback). They cross process boundaries as plain dicts (``to_dict``), never as
strings to parse.
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

    def to_dict(self) -> dict:
        return {"type": self.type, "message": self.message, "details": self.details}

    @classmethod
    def from_dict(cls, data: dict) -> "EngineError":
        return cls(message=data["message"], details=data.get("details", ""), type=data["type"])


class TargetError(EngineError):
    """The dataset target could not be turned into a Dataset."""


class ConfigError(EngineError):
    """Loader settings that DataLoader itself would reject (or that make no sense)."""


class RunError(EngineError):
    """The user's dataset, collate function or train step failed while the loader ran."""
