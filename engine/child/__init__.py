"""What runs in the engine's child process: the user's target resolved and described, the
settings a run starts from, the measuring loop, the search run against real
loaders (tuning.py, trial_run.py, companions.py), the process's session and how its failures
are explained."""
