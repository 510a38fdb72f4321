"""Fixes beyond the loader's knobs, named where the sampled profile recognises a stage, each
with the gain the ceiling's model predicts for it (analyse/ceiling.py's what-if): a fix is a
suggestion, never shown as measured unless it was.

A fix that takes a stage's work off the loader's CPU for good (tokenizing ahead) carries the
prediction for the stage "gone"; one that makes it cheaper (decoding at reduced size, shards
read in order) the prediction for it "at half its cost"; one that moves it to the GPU in the
training process none. Only stages the profile found, at MIN_SHARE or more of the loader's time,
are given fixes.

NOTE [ A fix that moves work into the training process ]

    Decoding or transforming on the GPU takes the work off the workers and puts it in the
    training process, batch by batch: a cost the loader's model does not see. Checked on an
    H100 with 14 CPU workers (bench/gpu_decode.py, tests/real/imagefolder_compose.py): the
    decode gone from the workers, predicted 3.31x, measured 2.62x (the images decoded ahead);
    torchvision's decode_jpeg(device="cuda") with the crops on the GPU image by image, as
    users write it, 0.89x: the training process's 17.8 ms a batch of 32 bound it. So such a
    fix claims no gain: it says what the loader's side alone would make, and why that is not
    the job's.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from dataloader_tuner.analyse.ceiling import (ALL_OF_IT, MIN_SHARE, THREADS_CHANGE, WAITING,
                                              BatchCost, ceiling_of, waiting_share, what_if)

IMAGE_FILES = ("/PIL/",)
TOKENIZER_FILES = ("/tokenizers/", "/transformers/tokenization")
AUDIO_FILES = ("/soundfile", "/torchaudio/", "/librosa/")
CACHE_SHARE = 0.3  # a function of the dataset's own with this much of the time: worth a cache


TO_TRAINING = ("; the loader's side alone: up to {gain:.1f}x, but the work then runs in your "
               "training process, batch by batch, at a cost not predicted here (on an H100 "
               "with 14 CPU workers, decode_jpeg on the GPU with per-image crops measured "
               "0.89x): measure it")


def _fix(stage: str, function: str | None, fix: str, how: str, change: str | None,
         what_if: Sequence[dict[str, Any]], to_training: bool = False) -> dict[str, Any]:
    """``to_training``: the fix moves the work into the training process (NOTE [ A fix that
    moves work into the training process ]): no gain claimed, the loader's side said."""
    row = next((w for w in what_if if w["change"] == change), None) if change else None
    loader_side = None
    if to_training:  # the row's gain is the loader's side only: said, not claimed
        loader_side, row = row and row["predicted_gain"], None
        if loader_side and math.isfinite(loader_side):
            how += TO_TRAINING.format(gain=loader_side)
    return {"stage": stage, "function": function, "fix": fix, "how": how,
            "predicted_samples_per_s": row and row["predicted_samples_per_s"],
            "predicted_gain": row and row["predicted_gain"],
            "measured_samples_per_s": row and row["measured_samples_per_s"],
            "loader_side_gain": loader_side}


def ranked_gain(fix: dict[str, Any]) -> float:
    """What a fix is ranked by: its measured gain where the tune measured it (threads that
    measured slower than the pick go below the predictions), else its predicted one."""
    gain = float(fix["predicted_gain"] or 0.0)
    if not math.isfinite(gain):  # (measured_row's NaN where no rate was known: last)
        return 0.0
    measured = fix["measured_samples_per_s"]
    if measured is None or not gain:
        return gain
    # the gain is over the pick's rate (measured_row): the same ratio, measured
    return float(measured) * gain / float(fix["predicted_samples_per_s"] or measured)


def _files(sampled: dict[str, Any], stage: str) -> str:
    return " ".join(str(h["file"]).replace("\\", "/") for h in sampled["hotspots"]
                    if h["stage"] == stage)


def named_fixes(sampled: dict[str, Any] | None, what_if: Sequence[dict[str, Any]],
                warnings: Sequence[str] = (), gpu: bool = True,
                waits: bool = False) -> list[dict[str, Any]]:
    """``sampled``: hotspots.py's merged stacks; ``what_if``: ceiling.what_if's rows; ``warnings``:
    the run's diagnostic codes; ``gpu``: one is visible here (a GPU fix says so where not);
    ``waits``: the cost model finds a batch's time mostly off the CPU (ceiling.waiting_share:
    it says so where the profile is too short, or off). Ranked by gain,
    measured where it was, else predicted (fixes without one last)."""
    # the tune's measurement of threads fetching (child/io_threads.py), where it made one
    threads = next((w["change"] for w in what_if if THREADS_CHANGE in w["change"]), None)
    enough = bool(sampled and sampled.get("enough"))
    waiting = [s["stage"] for s in (sampled["stages"] if sampled and enough else [])
               if s["stage"] in ("read", "your __getitem__") and s["share"] >= MIN_SHARE
               and s["share"] - s["cpu_share"] >= WAITING * s["share"]]
    fixes = []
    if waits or waiting:
        stage = waiting[0] if waiting else "your __getitem__"
        fixes.append(_fix(stage, None, "overlap the waits for storage",
                          "more workers, or threads inside each worker fetching a batch's "
                          "samples (remote storage: pytorch#158218, S3 2.32 -> 1.02 s an "
                          "iteration with threads)", threads or f"{stage} at half its cost",
                          what_if))
    if not sampled or not enough:
        return fixes
    on_gpu = "" if gpu else " (no GPU is visible here: for the machine that trains)"
    for stage in sampled["stages"]:
        name, share = stage["stage"], stage["share"]
        if share < MIN_SHARE:
            continue
        files = _files(sampled, name)
        half, gone = f"{name} at half its cost", f"{name} gone"
        if name == "decode" and any(p in files for p in IMAGE_FILES):
            fixes.append(_fix(name, None, "decode images smaller or faster",
                              "where you crop or resize down, `img.draft('RGB', (w, h))` "
                              "before `convert()` decodes a JPEG at 1/2-1/8 size; or "
                              "pillow-simd (libjpeg-turbo)", half, what_if))
            fixes.append(_fix(name, None, "decode images on the GPU",
                              "`torchvision.io.decode_jpeg(data, device='cuda')` on the "
                              "batch's bytes, or NVIDIA DALI" + on_gpu, gone, what_if,
                              to_training=True))
        elif name == "decode" and any(p in files for p in TOKENIZER_FILES):
            fixes.append(_fix(name, None, "tokenize once, ahead",
                              "`dataset.map(tokenize, batched=True)` (Hugging Face datasets) "
                              "and keep the ids; or tokenize a whole batch in collate_fn",
                              gone, what_if))
        elif name == "decode" and any(p in files for p in AUDIO_FILES):
            fixes.append(_fix(name, None, "decode audio once, ahead",
                              "decode and resample once to arrays on local disk (.npy, a "
                              "memmap) and read those", gone, what_if))
        elif name in waiting:
            continue  # (its fix is above)
        elif name == "read":
            fixes.append(_fix(name, None, "read shards, not a file per sample",
                              "pack samples into shards read in order (WebDataset tar, LMDB, "
                              "one memmap)", half, what_if))
        elif name.startswith("transform: ") and share < ALL_OF_IT:
            step = name.split(": ", 1)[1]
            fixes.append(_fix(name, None, f"run {step} on the GPU, per batch",
                              f"apply {step} to the whole batch after it is on the GPU "
                              "(torchvision.transforms.v2 on tensors, kornia)" + on_gpu, gone,
                              what_if, to_training=True))
    own = [h for h in sampled["hotspots"] if h["stage"] == "your __getitem__"
           and CACHE_SHARE <= h["total_share"] < ALL_OF_IT]
    if own:
        top = own[0]["function"]
        fixes.append(_fix("your __getitem__", top, f"cache what {top} makes",
                          f"if {top}'s output is the same every epoch (no random "
                          "augmentation inside it), keep it: in RAM, or on local disk",
                          f"{top} gone", what_if))
    if "worker_memory_growth" in warnings:
        fixes.append(_fix("your __getitem__", None, "stop copy-on-read growth",
                          "keep the dataset's per-sample data in numpy arrays or one bytes "
                          "buffer, not lists of Python objects", None, what_if))
    return sorted(fixes, key=lambda f: -ranked_gain(f))


def ceiling_fields(cost: BatchCost, sampled: dict[str, Any] | None, measured: float | None,
                   codes: Sequence[str], gpu: bool,
                   measured_first: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """A result's ``ceiling``, ``what_if`` (``measured_first``, then the predictions) and
    ``fixes``: what a tune and a run with workers say alike."""
    changes = [*measured_first, *what_if(cost, sampled, measured)]
    return {"ceiling": ceiling_of(cost, measured).to_dict(), "what_if": tuple(changes),
            "fixes": tuple(named_fixes(sampled, changes, codes, gpu,
                                       waiting_share(cost) >= WAITING))}
