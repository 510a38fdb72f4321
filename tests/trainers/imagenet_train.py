"""pytorch/examples' imagenet ``train()`` as written there (its AverageMeters, ``data_time`` from
the end of the last step or the epoch's start, before ``enumerate(train_loader)``; the batch to
the device, the model's step, ``accuracy`` top-1/top-5, ``loss.item()``, a progress line every
10 batches), over tests/real/imagenet_like's JPEGs at batch 32, a small CNN on the CPU, and a
``validate()`` between epochs that the meters leave out. Watched with the README's one line.

argv: DB WORKERS [EPOCHS]. Prints one JSON line: the loop's own share (its meters' sums) and
the tool's headline share, with their seconds.
"""

import json
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "real"))
from imagenet_like import make_dataset  # noqa: E402

from dataloader_tuner import watch  # noqa: E402


class AverageMeter:
    def __init__(self) -> None:
        self.sum, self.count = 0.0, 0

    def update(self, value: float, n: int = 1) -> None:
        self.sum += value * n
        self.count += n


def accuracy(output: torch.Tensor, target: torch.Tensor, topk=(1,)) -> list[torch.Tensor]:
    with torch.no_grad():
        maxk, batch_size = max(topk), target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
        return [correct[:k].reshape(-1).float().sum(0, keepdim=True).mul_(100.0 / batch_size)
                for k in topk]


def train(train_loader, model, criterion, optimizer, device, meters) -> None:
    batch_time, data_time, losses, top1 = meters
    model.train()
    end = time.time()
    for i, (images, target) in enumerate(train_loader):
        data_time.update(time.time() - end)
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        output = model(images)
        loss = criterion(output, target)
        acc1, _acc5 = accuracy(output, target, topk=(1, 4))
        losses.update(loss.item(), images.size(0))
        top1.update(acc1[0].item(), images.size(0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        batch_time.update(time.time() - end)
        end = time.time()
        if i % 10 == 0:
            print(f"[{i}/{len(train_loader)}] loss {losses.sum / losses.count:.3f}",
                  file=sys.stderr)


def validate(model: nn.Module) -> None:
    model.eval()
    with torch.no_grad():
        model(torch.randn(64, 3, 224, 224))


def main() -> None:
    db, workers = sys.argv[1], int(sys.argv[2])
    epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    torch.manual_seed(0)
    loader = DataLoader(make_dataset(), batch_size=32, shuffle=True, num_workers=workers)
    train_loader = watch(loader, name="imagenet", db=db)
    model = nn.Sequential(nn.Conv2d(3, 32, 7, stride=2), nn.ReLU(),
                          nn.Conv2d(32, 32, 3, stride=2), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 4))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    meters = (AverageMeter(), AverageMeter(), AverageMeter(), AverageMeter())
    for _epoch in range(epochs):
        train(train_loader, model, criterion, optimizer, torch.device("cpu"), meters)
        validate(model)
    result = train_loader.close()
    batch_time, data_time = meters[0], meters[1]
    print(json.dumps({"own_share": data_time.sum / batch_time.sum, "own_data_s": data_time.sum,
                      "own_batch_s": batch_time.sum, "share": result.input_wait["share"],
                      "waited_s": result.input_wait["waited_s"],
                      "loop_s": result.input_wait["loop_s"], "batches": result.batches}))


if __name__ == "__main__":
    main()
