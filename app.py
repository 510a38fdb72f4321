"""DataLoader Tuner dashboard entry point: `streamlit run app.py`.

Until the live dashboard lands, this page runs a real, short profile of a dataset module through
the engine and shows its measured summary.
"""

import streamlit as st

from dashboard.profile_page import render

st.set_page_config(page_title="DataLoader Tuner", layout="wide")
render()
