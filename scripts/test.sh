#!/usr/bin/env bash
# Installs what the tests need (torch pinned to the CPU wheel) and this checkout as the package
# dataloader_tuner (editable: the tests run the code here), then runs every test, the browser
# tests included. Works in a virtualenv or the system Python. Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -r requirements-test.txt
# litdata (tests/test_litdata.py) without its declared torchvision, whose PyPI wheel pulls a
# newer CUDA torch: it imports boto3 only (requirements-test.txt)
python3 -m pip install -q --no-deps litdata==0.2.76
python3 -m pip install -q --no-deps -e .
python3 -m pytest "$@"
