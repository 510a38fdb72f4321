"""What runs in the engine's child process: the user's target resolved and described, the
measuring loop and its consumer, the process's session and how its failures are explained."""
