"""The values measured per batch and per trial (rows, the dataset card, trials), the per-batch
bookkeeping every measuring loop shares (ledger.py) and the rows packed for a pipe (wire.py).
The recorder that ships them is run/recorder.py."""
