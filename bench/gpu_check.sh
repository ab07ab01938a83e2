#!/usr/bin/env bash
# One prepared run for a lent NVIDIA GPU (an H200), under 10 minutes:
#   1. the kernel tests natively on CUDA          (pytest tests/kernels)
#   2. the HF-parity tests on CUDA                (FOLIO_TEST_DEVICE=cuda pytest -m parity tests)
#   3. attention timings and bandwidth table      (bench/gpu_attention.py)
#   4. fused-MoE timings vs the torch path        (bench/moe_gpu.py; its parity tests ran in 1)
#   5. the delta rule's Triton prompt kernel vs the torch chunked form (bench/gated_delta_gpu.py;
#      its tests, tests/kernels/test_gated_delta_*triton.py, ran compiled in 1)
# Installs nothing from the network: the host's own torch and triton are used, and the
# editable install of this repo is done without dependencies (no constraints.txt there).
# Logs and a JSON of the timings go to $OUT (the device tool's folder) or /tmp/folio-gpu-check.
#
#   bash bench/gpu_check.sh            # PYTHON=/path/to/python to pick the interpreter
set -uo pipefail

cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOG_DIR=${OUT:-/tmp/folio-gpu-check}
mkdir -p "$LOG_DIR"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET                     # compiled kernels, on CUDA tensors

began=$(date +%s)
failed=0
summary=()

stage() {   # stage NAME LIMIT_SECONDS COMMAND...
    local name=$1 limit=$2 t0 rc
    shift 2
    echo "=== $name (limit ${limit}s): $*"
    t0=$(date +%s)
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$LOG_DIR/$name.log"
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || failed=1
    [ "$rc" -eq 124 ] && echo "=== $name: TIMED OUT after ${limit}s"
    summary+=("$(printf '%-14s rc=%-4s %4ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")")
}

echo "=== $(date -u +%Y-%m-%dT%H:%M:%SZ) $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader \
    || echo "nvidia-smi failed"
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'triton', triton.__version__, 'gpu', torch.cuda.is_available())" || exit 1

# Editable install against the host's packages; offline, so no dependency resolution.
"$PY" -m pip install -q --no-build-isolation --no-deps -e . >"$LOG_DIR/pip.log" 2>&1 \
    || echo "=== editable install failed (see pip.log); running from the source tree"

stage kernel_tests 120 "$PY" -m pytest -q -p no:cacheprovider tests/kernels
stage parity_tests 150 env FOLIO_TEST_DEVICE=cuda "$PY" -m pytest -q -p no:cacheprovider \
    -m parity tests
stage bench 150 "$PY" bench/gpu_attention.py --budget-s 120 --json "$LOG_DIR/gpu_attention.json"
stage moe_bench 110 "$PY" bench/moe_gpu.py --budget-s 60 --json "$LOG_DIR/moe_gpu.json"
stage delta_bench 40 "$PY" bench/gated_delta_gpu.py --json "$LOG_DIR/gated_delta_gpu.json"

echo "=== summary ($(( $(date +%s) - began ))s in all)"
printf '%s\n' "${summary[@]}"
exit $failed
