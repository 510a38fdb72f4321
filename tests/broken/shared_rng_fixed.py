"""shared_rng.py with the fix its diagnostic suggests: a generator per worker."""

import numpy as np
from torch.utils.data import get_worker_info

from tests.broken.shared_rng import Augmented, batch_size  # noqa: F401 - the module's extras


def worker_init_fn(worker_id):
    info = get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed % 2**32)


dataset = Augmented()
