#!/usr/bin/env bash
# Runs infra/gpu_check.py on the device machine (docs/gpu.md).
#
# The image's python3 (/opt/torch/.venv, Python 3.12) already holds a CUDA JAX (jax, jaxlib,
# jax-cuda13-plugin, jax-cuda13-pjrt 0.11.2, numpy, flatbuffers, ml_dtypes: KINDS.md), and that
# is what runs: a CUDA JAX cannot travel, since jaxlib's wheel alone (85.7 MiB for cp312 x86_64)
# and jax_cuda13_pjrt's (127.9 MiB) are over the 64 MiB a call may carry. Wheels carried in
# .whl/ (small pure-Python packages the image might lack) are installed first, first. Predictions written here by `gpu_check.py --predict-only .gpucheck/predictions.json`
# and carried are used where the live verdict cannot be computed there.
# Arguments go to gpu_check.py (e.g. --ops matmul,col_sum --budget-s 150 for a rerun).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}

if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 3
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 2
"$PY" -c 'import sys, jax, jaxlib; print("python", sys.version.split()[0], sys.executable,
"| jax", jax.__version__, "jaxlib", jaxlib.__version__)' 2>&1 | tail -n 1

args=()
[ -f .gpucheck/predictions.json ] && args+=(--predictions .gpucheck/predictions.json)
# The script keeps its own budget (300 s by default, start-up included); this is the backstop.
exec timeout -k 15 "${GPU_CHECK_TIMEOUT:-400}" "$PY" infra/gpu_check.py ${args[@]+"${args[@]}"} "$@"
