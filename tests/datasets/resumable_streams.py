"""IterableDatasets that keep their place for StatefulDataLoader, in the two shapes users
write: one that is its own iterator (torchdata's guide's), and one whose ``__iter__`` is a
generator with the dataset holding the state (torchtitan's). 48 items over the workers, each
~2 ms to make; item i is the number i."""

import time

from torch.utils.data import IterableDataset, get_worker_info

ITEMS = 48


class OwnIterator(IterableDataset):
    def __init__(self) -> None:
        self.next_item, self.step = 0, 1

    def __iter__(self):
        info = get_worker_info()
        self.step = info.num_workers if info else 1
        if not getattr(self, "resumed", False):
            self.next_item = info.id if info else 0
        self.resumed = False
        return self

    def __next__(self):
        if self.next_item >= ITEMS:
            raise StopIteration
        time.sleep(0.002)
        self.next_item += self.step
        return self.next_item - self.step

    def state_dict(self):
        return {"next_item": self.next_item}

    def load_state_dict(self, state):
        self.next_item, self.resumed = state["next_item"], True


class GeneratorIter(IterableDataset):
    def __init__(self) -> None:
        self.made = 0

    def __iter__(self):
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        for item in range(self.made * workers + worker, ITEMS, workers):
            time.sleep(0.002)
            self.made += 1
            yield item

    def state_dict(self):
        return {"made": self.made}

    def load_state_dict(self, state):
        self.made = state["made"]
