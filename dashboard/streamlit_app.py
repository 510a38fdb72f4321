"""The dashboard's pages: ``streamlit run app.py`` from a checkout, or ``dataloader-tuner
dashboard`` once installed (which runs this file)."""

import streamlit as st

from dataloader_tuner.dashboard import history_page, live_page, token_gate, watched_page

PAGES = [(live_page.render, "Live", "live"), (watched_page.render, "Training jobs", "jobs"),
         (history_page.render, "History", "history")]


def run() -> None:
    st.set_page_config(page_title="DataLoader Tuner", layout="wide")
    # Before anything else: a session without the token gets the page that says how to get
    # in, whichever page's address it opened (token_gate.py).
    admitted = token_gate.admitted()
    page = st.navigation([
        st.Page(render if admitted else token_gate.render_locked, title=title, url_path=path,
                default=path == "live")
        for render, title, path in PAGES], position="sidebar" if admitted else "hidden")
    page.run()


if __name__ == "__main__":  # as streamlit runs a script
    run()
