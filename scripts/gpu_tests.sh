#!/usr/bin/env bash
# Run every package's tests on a CUDA machine from a source checkout, with no network there.
#
# The wheels are built on any machine with the network (`nox -s gpu_wheels`, or
# `python -m pip wheel --no-deps -w .whl packages/mingru-*`) and copied along with the checkout. This script
# installs them with --no-index --no-deps into a private folder (the entry points of the plugin keep working;
# a bare PYTHONPATH to src/ would lose them) and runs pytest over the tests against the machine's own torch and
# triton, CUDA tests included and interpreter tests excluded.
#
# Usage: scripts/gpu_tests.sh [pytest arguments...]
# Environment: WHEELS (default .whl), PYTHON (default python3), SITE (install folder, default a new temp dir),
# JOBS (default 1: one pytest run; N > 1: one pytest process per test file, N at a time, each writing
# LOGS/<file>.log, then the tests marked gpu_memory in one process (LOGS/gpu_memory.log), then a summary
# line per log; the exit status is that of the worst).
set -euo pipefail
cd "$(dirname "$0")/.."

wheels=${WHEELS:-.whl}
python=${PYTHON:-python3}
site=${SITE:-$(mktemp -d)}

shopt -s nullglob
found=("$wheels"/mingru_core-*.whl "$wheels"/mingru_triton-*.whl "$wheels"/mingru_compile-*.whl)
if [ "${#found[@]}" -ne 3 ]; then
    echo "gpu_tests.sh: expected the three mingru wheels in $wheels, found: ${found[*]:-none}" >&2
    echo "build them with: nox -s gpu_wheels" >&2
    exit 2
fi
"$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "${found[@]}"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET MINGRU_SCAN

"$python" - <<'PY'
import torch, triton, mingru, mingru_triton
assert torch.cuda.is_available(), "gpu_tests.sh needs a CUDA device"
print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
print(f"mingru {mingru.__version__} from {mingru.__file__}; triton_scans.available(): {mingru.triton_scans.available()}")
PY
folders=(packages/mingru-core/tests packages/mingru-triton/tests packages/mingru-compile/tests)
jobs=${JOBS:-1}
if [ "$jobs" -le 1 ]; then
    exec "$python" -m pytest -p no:cacheprovider -m "not interpret" "${folders[@]}" "$@"
fi
logs=${LOGS:-$(mktemp -d)}
mkdir -p "$logs"
export python logs
# Slow files first, so that the longest runs start at once.
files=$(ls -S packages/*/tests/test_*.py)
status=0
# Exit code 5 (no test selected) is expected for a file of interpreter-only tests; any other failure counts.
# Tests marked gpu_memory (several GiB at once: over 2^31 elements, float64 references at T = 65536) are left
# to one process afterwards: beside the other files' processes they ran out of an 80 GB card's memory.
printf '%s\n' $files | xargs -P "$jobs" -I{} bash -c \
    'f={}; name=$(basename "$f" .py); "$python" -m pytest -p no:cacheprovider -q -rfE --tb=short \
        -m "not interpret and not gpu_memory" "$f" "$@" > "$logs/$name.log" 2>&1; rc=$?
     echo "exit $rc" >> "$logs/$name.log"
     [ "$rc" -eq 0 ] || [ "$rc" -eq 5 ]' _ "$@" \
    || status=1
# Here exit code 5 counts as a failure unless pytest arguments were given (they may select none of them).
rc=0
"$python" -m pytest -p no:cacheprovider -q -rfE --tb=short -m "gpu_memory and not interpret" "${folders[@]}" "$@" \
    > "$logs/gpu_memory.log" 2>&1 || rc=$?
echo "exit $rc" >> "$logs/gpu_memory.log"
if [ "$rc" -ne 0 ] && { [ "$rc" -ne 5 ] || [ "$#" -eq 0 ]; }; then
    status=1
fi
for log in "$logs"/test_*.log "$logs/gpu_memory.log"; do
    # A log with no summary line (pytest killed) must not stop the script under pipefail.
    summary=$(grep -E ' in [0-9.]+s' "$log" | tail -n 1 | tr -d '=' || true)
    printf '%-32s %-60s %s\n' "$(basename "$log" .log)" "${summary:-(no summary)}" "$(tail -n 1 "$log")"
done
exit "$status"
