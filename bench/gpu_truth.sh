#!/usr/bin/env bash
# Every GPU path on a real CUDA GPU, in one call (a lent GPU's time is short): the GPU tests,
# the JPEG decode fix's predicted gain against measured loops, a watched training on cuda:0
# and the dashboard's GPU charts, the copy/overhead bench, then the quick suite as far as its
# time box allows, to see what else differs where CUDA is present.
#
#     [DEADLINE_S=560] bash bench/gpu_truth.sh OUTDIR
#
# Writes into OUTDIR: machine.txt, gpu_tests.log, gpu_decode.txt, gpu_runs.sqlite (the watched
# runs, for the dashboard's screenshots elsewhere), dashboard.txt, gpu_copy.txt, suite.log. Each
# step has its own time box, cut to what is left of DEADLINE_S (a lease's call is bounded), and
# a failing step does not stop the next. Where the packages the dashboard
# needs are missing and ./.whl holds their wheels (a machine without an index), they are
# installed from there first. Prints a summary last.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash bench/gpu_truth.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
started=$(date +%s)
deadline=$(( started + ${DEADLINE_S:-560} ))
summary=()
step() {  # step NAME SECONDS LOG command...: runs the command in its time box, notes its rc
  local name=$1 seconds=$2 log=$3
  shift 3
  local left=$(( deadline - $(date +%s) ))
  if [ "$left" -lt "$seconds" ]; then seconds=$left; fi
  if [ "$seconds" -lt 10 ]; then summary+=("$name: not run (no time left)"); return; fi
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
step "gpu tests" 220 "$out/gpu_tests.log" "${pytest[@]}" -m gpu tests/test_gpu_real.py
# The decode bench's 1024 JPEGs take ~30 s of one core to make: after the timing tests (made
# beside them, a GPU-bound loop's rounds moved 0.61-1.38: torch's pool waits for a taken core)
step "the JPEG fixture" 60 /tmp/fixture.log \
  python3 -c "from tests.real import imagefolder_compose as p; p.make_dataset()"
step "bench/gpu_decode.py" 150 "$out/gpu_decode.txt" python3 bench/gpu_decode.py
step "watched training on cuda" 60 "$out/dashboard.txt" python3 examples/train_watched.py \
  --epochs 3 --device cuda --pin-memory --db "$out/gpu_runs.sqlite"
step "dashboard GPU charts" 120 "$out/dashboard.txt" \
  python3 bench/gpu_dashboard.py "$out/gpu_runs.sqlite" --start
step "bench/gpu_copy.py" 90 "$out/gpu_copy.txt" python3 bench/gpu_copy.py --repeats 5 --rounds 3
step "quick suite (not gpu, not browser)" "${SUITE_S:-240}" "$out/suite.log" \
  "${pytest[@]}" -m "not slow and not gpu" --ignore tests/test_browser.py -n 8

echo
echo "== gpu_truth summary ($(( $(date +%s) - started )) s) =="
printf '%s\n' "${summary[@]}"
grep -E "^(FAILED|ERROR)" "$out/gpu_tests.log" "$out/suite.log"
tail -n 1 "$out/gpu_tests.log" "$out/suite.log"
tail -n 9 "$out/gpu_decode.txt"
