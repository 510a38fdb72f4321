"""Only the person who started the dashboard drives it: a secret token in its URL.

The dashboard imports and runs whatever module is typed into it, as the person who started it,
and shows their run history; on a shared machine every user can reach 127.0.0.1. So, as
Jupyter does, it opens only with a token: made when the server starts (or given with
``--token`` / DLTUNER_TOKEN), printed in the URL where it was started. Until a browser session
shows it, the session gets the page that says how to get in and nothing else: no target is
inspected, no run started, no history read, no job asked to tune (streamlit_app.py asks here
before anything else). Once in, the session stays in across pages, and the token is kept in
the URL so that a reload stays in too.

DLTUNER_NO_TOKEN=1 (``--no-token``) opens it to anyone who can reach it, as before.
"""

from __future__ import annotations

import os
import sys
import threading

import streamlit as st

from dataloader_tuner.ui import (NO_TOKEN_ENV, TOKEN_ENV, TOKEN_QUERY, dashboard_url, new_token,
                                 tokens_match)

_ADMITTED = "_dltuner_admitted"  # session_state: the token this browser session showed

_made: str | None = None  # the token this server made itself (streamlit run app.py)
_making = threading.Lock()


def expected_token() -> str | None:
    """The token this server opens with, or None where it takes none (DLTUNER_NO_TOKEN=1).
    Started by ``streamlit run`` without one: made on the first visit and printed to the
    terminal that started the server (Streamlit runs none of our code before a visit)."""
    global _made
    if os.environ.get(NO_TOKEN_ENV) == "1":
        return None
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    with _making:
        if _made is None:
            _made = new_token()
            address = dashboard_url(st.get_option("server.address") or "127.0.0.1",
                                    st.get_option("server.port"), _made)
            print(f"DataLoader Tuner opens with its token: {address}", file=sys.stderr,
                  flush=True)
        return _made


def admitted() -> bool:
    """Whether this browser session may use the dashboard (it showed the token, now or before
    in this session). Compared in constant time."""
    token = expected_token()
    if token is None:
        return True
    if st.session_state.get(_ADMITTED) == token:
        if st.query_params.get(TOKEN_QUERY) != token:
            # (Streamlit clears the URL's parameters on a change of page): back, for reloads
            st.query_params[TOKEN_QUERY] = token
        return True
    offered = st.query_params.get(TOKEN_QUERY, "")
    if offered and tokens_match(offered, token):
        st.session_state[_ADMITTED] = token
        return True
    return False


def render_locked() -> None:
    """The only page a session without the token gets."""
    st.title("DataLoader Tuner")
    offered = bool(st.query_params.get(TOKEN_QUERY))
    if offered:
        st.error("The token in this address is not this dashboard's: a new one is made each "
                 "time the dashboard starts, unless it was started with --token.")
    st.markdown(
        "This dashboard runs Python code as the person who started it, so it opens only with "
        "its token. Open the address printed where it was started:\n\n"
        "- `dataloader-tuner dashboard` printed `http://127.0.0.1:8501/?token=...` as it "
        "started;\n"
        "- `streamlit run app.py`: the address with the token was printed in its terminal "
        "as this page opened.\n\n"
        "On a remote machine, forward the port over SSH "
        "(`ssh -L 8501:127.0.0.1:8501 you@server`) and open the same address here.")
