#!/usr/bin/env bash
# Installs what the tests need (torch pinned to the CPU wheel) and this checkout as the package
# dataloader_tuner (editable: the tests run the code here), then runs every test, the browser
# tests included. Works in a virtualenv or the system Python.
# Usage: bash scripts/test.sh            every test: the quick ones on two processes, then the
#                                        slow ones one at a time (docs/development.md#tests)
#        bash scripts/test.sh ARGS...    pytest ARGS as given (e.g. -m "not slow" -n 2)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -r requirements-test.txt
# litdata (tests/test_litdata.py) without its declared torchvision, whose PyPI wheel pulls a
# newer CUDA torch: it imports boto3 only (requirements-test.txt)
python3 -m pip install -q --no-deps litdata==0.2.76
python3 -m pip install -q --no-deps -e .
if [ "$#" -gt 0 ]; then
  exec python3 -m pytest "$@"
fi
# The quick tests side by side (206 -> 138 s on 2 cores); the slow ones alone, as most compare
# speeds or wait on timings that a neighbouring test would move. Both run even if one fails.
quick=0
python3 -m pytest -m "not slow" -n 2 || quick=$?
slow=0
python3 -m pytest -m slow || slow=$?
# pytest's 5 ("no tests collected") is a failure here too: each phase has tests
exit $(( quick != 0 ? quick : slow ))
