"""The search for settings: trials' statistics, the cost model, the tuner and its reasons.
Pure: measurements come in through a function."""
