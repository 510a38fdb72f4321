"""What every page shares: the server-wide job board and the run store behind it."""

from __future__ import annotations

import streamlit as st

from dataloader_tuner import RunStore

from .jobs import Jobs


@st.cache_resource
def get_jobs() -> Jobs:
    """One per server process (not per tab): see jobs.py for why."""
    return Jobs(RunStore())
