"""The dashboard's pages: ``streamlit run app.py`` from a checkout, or ``dataloader-tuner
dashboard`` once installed (which runs this file)."""

import streamlit as st

from dataloader_tuner.dashboard import history_page, live_page, watched_page


def run() -> None:
    st.set_page_config(page_title="DataLoader Tuner", layout="wide")
    page = st.navigation([
        st.Page(live_page.render, title="Live", url_path="live", default=True),
        st.Page(watched_page.render, title="Training jobs", url_path="jobs"),
        st.Page(history_page.render, title="History", url_path="history"),
    ])
    page.run()


if __name__ == "__main__":  # as streamlit runs a script
    run()
