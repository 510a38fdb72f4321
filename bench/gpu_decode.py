"""Is "decode images on the GPU" worth what the tool predicts? Checked on a CUDA machine.

    python bench/gpu_decode.py [--workers N] [--seconds S] [--rounds R] [--json PATH]

The pipeline is tests/real/imagefolder_compose.py (an ImageFolder of 1024 photo-sized JPEGs,
Pillow's decode, RandomResizedCrop(112), a flip, ToTensor, Normalize; batches of 32).

1. The tool's prediction: ``profile`` of the module with N persistent workers and pinned memory
   (a real engine child), its fix "decode images on the GPU" and the gain predicted for it (the
   decode gone from the loader's work, bounded by the machine's other limits), and its rate.
2. Plain loops over N persistent workers, each batch copied to the GPU and waited for,
   R rounds in alternating order (A B C, C B A, ...), the median rate of each:
   - as is: the module's dataset, unchanged;
   - decode gone: the same, each image decoded once ahead and held (the file is still read):
     the premise of the prediction, the loader's work less the decode;
   - decode on the GPU: the fix as users make it: the workers read the files' bytes, the main
     process decodes the batch with ``torchvision.io.decode_jpeg(device="cuda")`` and crops,
     flips and normalises it there (the transforms after a decode move with it).
Prints the measured gains (median of the rounds' ratios, with their range) beside the
prediction. Needs a CUDA GPU and torchvision's CUDA build for the third loop (without them it
says so and measures what it can; ``--device cpu`` runs the first two loops anywhere).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, Dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.real import imagefolder_compose as pipeline  # noqa: E402
from tests.real import imagenet_like  # noqa: E402

TARGET = os.path.join(ROOT, "tests", "real", "imagefolder_compose.py")
FIX = "decode images on the GPU"


def predicted(workers: int, seconds: float) -> dict[str, Any]:
    """The engine's profile of the pipeline: its rate and the fix's predicted gain."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    os.makedirs(os.path.join(ROOT, "test-artifacts"), exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "dataloader_tuner", "profile", TARGET,
                           "--num-workers", str(workers), "--pin-memory",
                           "--persistent-workers", "--seconds",
                           str(seconds), "--json", "--db", os.path.join(ROOT, "test-artifacts",
                                                                     "gpu_decode.sqlite")],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"profile failed ({done.returncode}): {done.stderr[-2000:]}")
    doc = json.loads(done.stdout)
    fix = next((f for f in doc.get("fixes") or () if f["fix"] == FIX), None)
    return {"samples_per_s": doc["samples_per_s"], "fix": fix,
            "main_process": doc.get("main_process"),
            "stages": [(s["stage"], s["share"]) for s in doc.get("stages") or ()],
            "ceiling": doc.get("ceiling"), "fixes": [(f["fix"], f["predicted_gain"])
                                                    for f in doc.get("fixes") or ()]}


class DecodedAhead(Dataset):
    """The pipeline's dataset with each image decoded once, ahead: the file is still opened
    and read as pil_loader reads it, the decode is a lookup."""

    def __init__(self) -> None:
        self.inner = pipeline.make_dataset()
        paths = [path for path, _ in self.inner.samples]
        with ThreadPoolExecutor(os.cpu_count() or 2) as pool:  # Pillow's decode frees the GIL
            images = list(pool.map(pipeline.pil_loader, paths))
        self.images = dict(zip(paths, images))
        self.inner.loader = self.read_and_look_up

    def read_and_look_up(self, path: str):
        with open(path, "rb") as f:
            f.read()
        return self.images[path]

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int):
        return self.inner[index]


class FileBytes(Dataset):
    """The fix's loader side: each sample is its JPEG's bytes (a uint8 tensor) and label."""

    def __init__(self) -> None:
        self.samples = pipeline.make_dataset().samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, target = self.samples[index]
        with open(path, "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8), target


def bytes_collate(batch: list) -> tuple[list[torch.Tensor], torch.Tensor]:
    return [data for data, _ in batch], torch.tensor([target for _, target in batch])


class GpuTransform:
    """decode_jpeg on the GPU, then the pipeline's transforms there, image by image (the crops
    differ in size), stacked: the same work as the CPU pipeline's, as a batch of float32."""

    def __init__(self, device: str) -> None:
        from torchvision.io import decode_jpeg
        from torchvision.transforms.v2 import functional

        self.decode, self.functional, self.device = decode_jpeg, functional, device
        self.mean = torch.tensor(pipeline.MEAN, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(pipeline.STD, device=device).view(1, 3, 1, 1)

    def __call__(self, batch: tuple[list[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        datas, _ = batch
        images = self.decode(datas, device=self.device)
        out = []
        for image in images:
            height, width = image.shape[-2:]
            top, left, h, w = imagenet_like.random_resized_crop_params(width, height)
            crop = self.functional.resized_crop(image, top, left, h, w,
                                                [pipeline.CROP, pipeline.CROP], antialias=True)
            out.append(self.functional.horizontal_flip(crop) if random.random() < 0.5
                       else crop)
        stacked = torch.stack(out).float().div_(255)
        return (stacked - self.mean) / self.std


def timed_rate(loader: DataLoader, on_device: Callable[[Any], Any], seconds: float,
               warmup: int) -> float:
    """Samples a second into the device, each batch waited for, after ``warmup`` batches."""
    samples, started, t0 = 0, 0, 0.0
    while True:
        for batch in loader:
            on_device(batch)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            started += 1
            if started == warmup:
                t0 = time.monotonic()
            elif started > warmup:
                samples += len(batch[1])
                if time.monotonic() - t0 >= seconds:
                    return samples / (time.monotonic() - t0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json")
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("needs a CUDA GPU (torch.cuda.is_available() is False); --device cpu measures "
              "the first two loops anywhere")
        return 2
    gpu_transform = None
    if cuda:
        try:
            gpu_transform = GpuTransform(args.device)
        except Exception as exc:  # a torchvision that does not import beside this torch
            print(f"decode on the GPU not measured: torchvision did not load ({exc!r})")

    prediction = predicted(args.workers, args.seconds)
    print(f"profile ({args.workers} persistent workers, pinned): "
          f"{prediction['samples_per_s']:.0f} samples/s; stages {prediction['stages']}; "
          f"fixes {prediction['fixes']}; main process {prediction['main_process']}; "
          f"ceiling {prediction['ceiling']}")

    def copy(batch):
        return batch[0].to(args.device, non_blocking=True)

    common = dict(batch_size=pipeline.batch_size, shuffle=True, num_workers=args.workers,
                  persistent_workers=True)
    ways: dict[str, tuple[DataLoader, Callable[[Any], Any]]] = {
        "as is": (DataLoader(pipeline.make_dataset(), pin_memory=cuda, **common), copy),
        "decode gone": (DataLoader(DecodedAhead(), pin_memory=cuda, **common), copy),
    }
    if gpu_transform is not None:
        ways["decode on the GPU"] = (DataLoader(FileBytes(), collate_fn=bytes_collate,
                                                **common), gpu_transform)
    warmup = 2 * args.workers
    rates: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(args.rounds):
        order = list(ways) if round_ % 2 == 0 else list(reversed(list(ways)))
        for name in order:
            loader, on_device = ways[name]
            try:
                rates[name].append(timed_rate(loader, on_device, args.seconds, warmup))
            except Exception as exc:  # the fix's own code (torchvision's GPU decode) failing
                if name == "as is":
                    raise
                print(f"{name} not measured: {exc!r}")
                del ways[name], rates[name]
        print(f"round {round_ + 1}: " + ", ".join(f"{n} {rates[n][-1]:.0f}" for n in ways),
              flush=True)
    fix = prediction["fix"]
    print(f"\n{args.workers} workers on {os.cpu_count()} CPUs"
          + (f", {torch.cuda.get_device_name(0)}" if cuda else "") + "; samples/s (median):")
    report: dict[str, Any] = {"workers": args.workers, "cpus": os.cpu_count(),
                              "prediction": prediction, "rates": rates}
    for name in ways:
        line = f"  {name:18s} {statistics.median(rates[name]):8.0f}"
        if name != "as is":
            ratios = [r / a for r, a in zip(rates[name], rates["as is"])]
            report[f"{name} gain"] = ratios
            line += (f"   {statistics.median(ratios):.2f}x as is "
                     f"({min(ratios):.2f}-{max(ratios):.2f})")
        print(line)
    print(f"  tool's rate (profile) / plain as is: "
          f"{prediction['samples_per_s'] / statistics.median(rates['as is']):.2f}")
    print(f"  predicted for '{FIX}': "
          + (f"{fix['predicted_gain']:.2f}x ({fix['predicted_samples_per_s']:.0f} samples/s)"
             if fix and fix["predicted_gain"] else "not offered (no decode stage found)"))
    for loader, _ in ways.values():
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None:  # persistent workers: end them now, not at exit
            iterator._shutdown_workers()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
