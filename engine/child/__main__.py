"""``python -m dataloader_tuner.child``: the engine's child process (see dataloader_tuner.child.process)."""

from dataloader_tuner.child.process import main

main()
