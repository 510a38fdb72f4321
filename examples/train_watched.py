"""A real training job, watched: a small CNN learns where a bright square sits in noisy images.

    python examples/train_watched.py [--epochs 3] [--workers 2] [--step-ms 0] [--tune]
                                     [--device auto|cpu|cuda|cuda:N]

The one line that matters is ``watch(...)`` around each DataLoader: the training loop itself is
unchanged. While it trains, the dashboard (``streamlit run app.py``, History page) lists the job
with its two loaders ("train" and "val") and shows their input wait, step time and workers live.
At the end each run's headline is printed, and ``python -m dataloader_tuner runs`` lists them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

try:
    from dataloader_tuner import watch
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from dataloader_tuner import watch


class BrightSquare(Dataset):
    """16x16 noise with a bright 4x4 square in one of four quadrants; the quadrant is the
    label. Each read adds fresh noise (an augmentation with a little CPU work, as real ones)."""

    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 4, (size,), generator=generator)
        self.images = torch.randn(size, 1, 16, 16, generator=generator)
        for i, label in enumerate(self.labels.tolist()):
            row, col = divmod(label, 2)
            self.images[i, 0, row * 8 + 2:row * 8 + 6, col * 8 + 2:col * 8 + 6] += 0.4

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        image = self.images[index] + 0.3 * torch.randn(1, 16, 16)
        return image, int(self.labels[index])


def make_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(16 * 4 * 4, 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--step-ms", type=float, default=0.0,
                        help="extra time per step, as a bigger model would take")
    parser.add_argument("--db", default=None, help="run history (default: the dashboard's)")
    parser.add_argument("--device", default="auto",
                        help="where the model trains (auto: cuda when a GPU is visible); on a "
                             "GPU each batch is copied with the watched loader's .to(), which "
                             "times the copy and the GPU's idle gaps")
    parser.add_argument("--pin-memory", action="store_true", help="the train loader's pin_memory")
    parser.add_argument("--tune", action="store_true",
                        help="let the tool tune the train loader in place while it trains")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"

    train = watch(DataLoader(BrightSquare(args.samples, seed=1), batch_size=64, shuffle=True,
                             num_workers=args.workers, pin_memory=args.pin_memory),
                  name="train", db=args.db, tune=args.tune)
    val = watch(DataLoader(BrightSquare(args.samples // 4, seed=2), batch_size=256),
                name="val", db=args.db)
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        model.train()
        for batch in train:
            images, labels = train.to(batch, device)
            optimizer.zero_grad()
            loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
        model.eval()
        correct = seen = 0
        with torch.no_grad():
            for batch in val:
                images, labels = val.to(batch, device)
                correct += int((model(images).argmax(1) == labels).sum())
                seen += len(labels)
        print(f"epoch {epoch}: loss {loss.item():.3f}, val accuracy {correct / seen:.1%}",
              flush=True)

    for loader in (train, val):
        result = loader.close()
        print(json.dumps({"name": loader.name, "run_id": loader.run_id,
                          "samples_per_s": result.samples_per_s if result else None,
                          "input_wait": result.consumer_idle_frac if result else None,
                          "verdict": result.input_bound if result else None}), flush=True)


if __name__ == "__main__":
    main()
