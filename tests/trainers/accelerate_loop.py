"""A training loop on accelerate without the Trainer: its prepared loader watched in one line.
Prints, as JSON, what the loop received (each batch's first index) and the loop's own clock of
its data wait. argv: DB [--unwatched] [--persistent] [--tune EPOCHS] (tuned in place over
EPOCHS epochs)."""

import json
import sys
import time

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset

from dataloader_tuner import watch


class Slow(Dataset):
    """Sample i carries i; 1 ms to make, so 2 workers make an 8-sample batch in ~4 ms."""

    def __len__(self) -> int:
        return 192

    def __getitem__(self, index: int):
        time.sleep(0.001)
        return torch.full((4,), float(index)), index % 2


def main() -> None:
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Slow(), batch_size=8, shuffle=True, num_workers=2,
                        persistent_workers="--persistent" in sys.argv)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if "--unwatched" not in sys.argv:
        loader = watch(loader, name="train", db=sys.argv[1], tune="--tune" in sys.argv,
                       max_workers=4)
    received, waited, started = [], 0.0, time.monotonic()
    epochs = int(sys.argv[sys.argv.index("--tune") + 1]) if "--tune" in sys.argv else 2
    epoch_waits = []
    for epoch in range(epochs):
        epoch_waits.append(-waited)
        asked = time.monotonic()
        iterator = iter(loader)  # the epoch's start-up is the loop's wait too
        while True:
            try:
                x, y = next(iterator)
            except StopIteration:
                break
            waited += time.monotonic() - asked
            received.append(int(x[0, 0]))
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            time.sleep(0.003)  # the rest of a step
            asked = time.monotonic()
        epoch_waits[-1] += waited
    print(json.dumps({"type": type(loader).__name__, "received": received,
                      "wait_share": waited / (time.monotonic() - started), "waited_s": waited,
                      "epoch_waits_s": epoch_waits}))


if __name__ == "__main__":
    main()
