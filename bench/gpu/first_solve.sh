#!/usr/bin/env bash
# The first solve after a plain `pip install` (no kernel warm-up) on the device: its whole-process wall against
# its limit, the background compile it leaves, and the next solve. Writes first-solve.log under $1 (or .).
#   bench/gpu/first_solve.sh OUT_DIR [TRACE] [LIMIT_S]
set -uo pipefail
out=${1:-.}; trace=${2:-traces/gpt2-medium-bf16-b20-s1024-h200.json}; limit=${3:-10}
PY=${PYTHON:-python3}
exec > >(tee -a "$out/first-solve.log") 2>&1
if ls .whl/*.whl > /dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
$PY -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
export NUMBA_CACHE_DIR=$(mktemp -d)   # empty: as after an install that compiled nothing
for run in first second; do
  t0=$EPOCHREALTIME
  $PY -m memsched.cli solve "$trace" --budget 50% --time-limit "$limit" --json -o "$out/$run.schedule.json" \
    > "$out/$run.json" 2> "$out/$run.err"
  rc=$?
  t1=$EPOCHREALTIME
  echo "$run solve: exit $rc, whole process $(awk "BEGIN{print $t1 - $t0}") s for --time-limit $limit"
  $PY -c "import json,sys; s=json.load(open(sys.argv[1]))['solver']; print(' ', s['backend'], s['status'], 'gap', round(100*s['gap'],2), '%;', s['message'])" "$out/$run.json"
  grep -h "background" "$out/$run.err"
  if [ "$run" = first ]; then
    t2=$EPOCHREALTIME
    while pgrep -f "memsched.optimizer.jit" > /dev/null; do sleep 1; done
    echo "background compile ended $(awk "BEGIN{print $EPOCHREALTIME - $t2}") s after the first solve"
  fi
done
