"""The parent side of a run: start the engine's child, fold its events, keep them. No torch."""
