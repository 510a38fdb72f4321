"""A clock for the pure searches: simulated time that moves only when a test moves it."""


class SimulatedClock:
    """Seconds, starting at 0; ``advance`` by each simulated batch's time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class LeapingClock:
    """Each reading a minute after the last: a real loader's search, with its prewarm and
    every trial's time cap passed at once (each trial then ends at its fewest batches)."""

    def __init__(self, leap_s: float = 60.0) -> None:
        self.now, self.leap_s = 0.0, leap_s

    def __call__(self) -> float:
        self.now += self.leap_s
        return self.now
