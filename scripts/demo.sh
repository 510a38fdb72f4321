#!/usr/bin/env bash
# Installs the dashboard's requirements and this checkout as the package dataloader_tuner, then
# opens the dashboard on the built-in demo dataset.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -r requirements.txt
python3 -m pip install -q --no-deps -e .
# (prints the address to open, with the token the dashboard opens with)
exec python3 -m dataloader_tuner dashboard "$@"
