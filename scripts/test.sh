#!/usr/bin/env bash
# Installs what the tests need (torch pinned to the CPU wheel) and runs every test, the browser
# tests included. Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -r requirements-test.txt
python3 -m pytest "$@"
