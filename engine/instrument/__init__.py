"""What touches the user's loader to measure it: probes in the workers, resource samples,
GPU and copy timing."""
