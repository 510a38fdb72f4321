"""A Ray Train job (TorchTrainer, 2 CPU workers on a local Ray, gloo), each worker's loader
watched with the README's line. Ray ends its worker processes once the training function
returns, without exit handlers (NOTE [ Runs ended without a word ], engine/run/settle.py).
Prints, as JSON, each rank's batches as its own loop counted them.
argv: DB STEP_S [--prepare] (the loader through ray.train.torch.prepare_data_loader)."""

import json
import os
import sys
import tempfile

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no token written under ~/.ray
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray  # noqa: E402
from ray.train import ScalingConfig, RunConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402

EPOCHS, ITEMS, BATCH = 2, 256, 8


def train_loop(config: dict) -> None:
    import time

    import ray.train
    import ray.train.torch
    from torch.utils.data import DataLoader, DistributedSampler

    from dataloader_tuner import watch

    data = list(range(ITEMS))
    if config["prepare"]:  # Ray's guide: it adds the DistributedSampler itself
        loader = ray.train.torch.prepare_data_loader(
            DataLoader(data, batch_size=BATCH, num_workers=1))
    else:
        loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data),
                            num_workers=1)
    loader = watch(loader, name="train", db=config["db"])
    counted = 0
    for epoch in range(EPOCHS):
        for _ in loader:
            counted += 1
            time.sleep(config["step_s"])
    rank = ray.train.get_context().get_world_rank()
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "batches": counted, "pid": os.getpid()}, f)


if __name__ == "__main__":
    db, step_s = sys.argv[1], float(sys.argv[2])
    out = tempfile.mkdtemp()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        TorchTrainer(train_loop,
                     train_loop_config={"db": db, "step_s": step_s, "out": out,
                                        "prepare": "--prepare" in sys.argv},
                     scaling_config=ScalingConfig(num_workers=2, use_gpu=False,
                                                  resources_per_worker={"CPU": 0.5}),
                     run_config=RunConfig(storage_path=out)).fit()
    finally:
        ray.shutdown()
    ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in (0, 1)]
    print(json.dumps(ranks))
