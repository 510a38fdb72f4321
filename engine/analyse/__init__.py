"""Pure reading of measurements: per-batch metrics, diagnostics, the pitfalls they reveal,
finished results and traces."""
