"""A run's sampled stacks as a speedscope file (https://www.speedscope.app): the flame graph
tool people already use, with every stack the icicle summarises. Each stack is rooted at its
stage ("stage: decode"), so speedscope's left-heavy view groups it as the dashboard does."""

from __future__ import annotations

from typing import Any

SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def speedscope_document(collapsed: dict[str, Any], name: str) -> dict[str, Any]:
    """The file for ``collapsed`` (analyse/hotspots.py's merged stacks: frames and stacks), one
    sampled profile weighted in seconds of the loader's work."""
    frames = [{"name": str(function), "file": str(file), "line": int(line)}
              for function, file, line in collapsed["frames"]]
    stage_frames: dict[str, int] = {}
    samples, weights = [], []
    for stage, indices, seconds in collapsed["stacks"]:
        if stage not in stage_frames:
            stage_frames[stage] = len(frames)
            frames.append({"name": f"stage: {stage}"})
        samples.append([stage_frames[stage], *indices])
        weights.append(seconds)
    return {
        "$schema": SCHEMA,
        "name": name,
        "exporter": "dataloader-tuner",
        "activeProfileIndex": 0,
        "shared": {"frames": frames},
        "profiles": [{"type": "sampled", "name": name, "unit": "seconds", "startValue": 0,
                      "endValue": round(sum(weights), 6), "samples": samples,
                      "weights": weights}],
    }
