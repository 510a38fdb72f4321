#!/usr/bin/env bash
# Installs the dashboard's requirements and opens it on the built-in demo dataset.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -r requirements.txt
exec python3 -m streamlit run app.py "$@"
