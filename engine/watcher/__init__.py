"""A user's training job, measured in its own process: ``dataloader_tuner.watch(loader)``."""
