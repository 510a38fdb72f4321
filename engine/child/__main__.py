"""``python -m engine.child``: the engine's child process (see engine.child.process)."""

from engine.child.process import main

main()
