#!/usr/bin/env bash
# Every GPU path on a real CUDA GPU, in one call (a lent GPU's time is short): the GPU tests,
# the copy/overhead bench, a watched training on cuda:0 and the dashboard's GPU charts, then the
# quick suite as far as its time box allows, to see what else differs where CUDA is present.
#
#     bash bench/gpu_truth.sh OUTDIR
#
# Writes into OUTDIR: machine.txt, gpu_tests.log, gpu_copy.txt, gpu_runs.sqlite (the watched
# runs, for the dashboard's screenshots elsewhere), dashboard.txt, suite.log. Each step has its
# own time box and a failing step does not stop the next. Where the packages the dashboard
# needs are missing and ./.whl holds their wheels (a machine without an index), they are
# installed from there first. Prints a summary last.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash bench/gpu_truth.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
started=$(date +%s)
summary=()
step() {  # step NAME SECONDS LOG command...: runs the command in its time box, notes its rc
  local name=$1 seconds=$2 log=$3
  shift 3
  local t0=$(date +%s)
  timeout "$seconds" "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  summary+=("$name: rc $rc in $(( $(date +%s) - t0 )) s")
}

if [ -d .whl ] && ! python3 -c "import streamlit, plotly" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . || echo "editable install failed"

{ nvidia-smi; nproc; python3 -c "import torch, sys; print(sys.version); print('torch', \
torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name(0), \
torch.cuda.get_device_properties(0))"; } > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

pytest=(python3 -m pytest -p no:cacheprovider -q -rA --timeout 150)
step "gpu tests, simulated step" 120 "$out/gpu_tests.log" \
  "${pytest[@]}" -m gpu tests/test_gpu_real.py -k simulated
step "gpu tests, all" 300 "$out/gpu_tests.log" "${pytest[@]}" -m gpu tests/test_gpu_real.py
step "bench/gpu_copy.py" 180 "$out/gpu_copy.txt" python3 bench/gpu_copy.py
step "watched training on cuda" 120 "$out/dashboard.txt" python3 examples/train_watched.py \
  --epochs 3 --device cuda --pin-memory --db "$out/gpu_runs.sqlite"
step "dashboard GPU charts" 180 "$out/dashboard.txt" \
  python3 bench/gpu_dashboard.py "$out/gpu_runs.sqlite" --start
step "quick suite (not gpu, not browser)" "${SUITE_S:-240}" "$out/suite.log" \
  "${pytest[@]}" -m "not slow and not gpu" --ignore tests/test_browser.py

echo
echo "== gpu_truth summary ($(( $(date +%s) - started )) s) =="
printf '%s\n' "${summary[@]}"
grep -E "^(PASSED|FAILED|ERROR|SKIPPED)" "$out/gpu_tests.log" | sort | uniq -c | sort -rn | head -30
tail -n 3 "$out/suite.log"
