"""DataLoader Tuner dashboard: `streamlit run app.py` (serves on 127.0.0.1, see .streamlit/)."""

from dataloader_tuner.dashboard.streamlit_app import run

run()
