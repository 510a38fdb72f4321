"""What runs in the engine's child process: the user's target, the measuring loop, the probes
in the workers, the GPU, and the tune session."""
