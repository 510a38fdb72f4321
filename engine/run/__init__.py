"""A run made and kept: the recorder that ships each batch's rows to a sink (the engine child's
pipe, a watched job's history), and the parent side: start the engine's child, fold its events
into a LiveRun, keep them. No torch."""
