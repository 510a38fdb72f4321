"""A corpus of realistic target modules: the dataset shapes real users point the tool at.

Each module defines ``make_dataset()`` and the optional extras the engine reads
(``batch_size``, ``collate_fn``, ``sampler``, ``dataloader_kwargs``, ``train_step``), plus an
``EXPECTED`` dict the tests check the tool's findings against. Data is generated at test time
by ``_data.fixture_dir``; ``plain_loop.plain_rate`` measures each module with a plain DataLoader.
"""
