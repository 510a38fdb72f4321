"""A clock for the pure searches: simulated time that moves only when a test moves it."""


class SimulatedClock:
    """Seconds, starting at 0; ``advance`` by each simulated batch's time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
