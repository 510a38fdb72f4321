"""A user's training job, measured in its own process: ``engine.watch(loader)``."""
