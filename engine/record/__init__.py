"""Recording batches: the per-batch rows and the recorder that ships them to a sink."""
