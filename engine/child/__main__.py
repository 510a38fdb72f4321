"""``python -m dataloader_tuner.child``: the engine's child process (see child/process.py)."""

from dataloader_tuner.child.process import main

main()
