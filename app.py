"""DataLoader Tuner dashboard: `streamlit run app.py` (serves on 127.0.0.1, see .streamlit/)."""

import streamlit as st

from dashboard import history_page, live_page, watched_page

st.set_page_config(page_title="DataLoader Tuner", layout="wide")
page = st.navigation([
    st.Page(live_page.render, title="Live", url_path="live", default=True),
    st.Page(watched_page.render, title="Training jobs", url_path="jobs"),
    st.Page(history_page.render, title="History", url_path="history"),
])
page.run()
