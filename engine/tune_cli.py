"""Placeholder replaced by the tuner's CLI."""


def add_tune_parser(sub, add_common, positive_int, non_negative_float):
    return None
