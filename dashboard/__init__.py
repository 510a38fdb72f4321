"""Streamlit pages and pure figure builders. All measuring happens in engine/."""
