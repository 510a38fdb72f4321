"""Items for litdata's ``optimize`` (its worker processes import this function by name): item i
is ``{"index": i, "x": 4 copies of i}``. ``python -m tests.datasets.litdata_items DIR N``
writes N of them as chunks of ~1 KB in DIR."""

import sys

import torch


def item(index: int) -> dict:
    return {"index": index, "x": torch.full((4,), float(index))}


if __name__ == "__main__":
    from litdata import optimize

    optimize(fn=item, inputs=list(range(int(sys.argv[2]))), output_dir=sys.argv[1],
             chunk_bytes="1KB", num_workers=1)
