#!/usr/bin/env bash
# Runs infra/gpu_engine_check.py on the device machine (docs/gpu.md): the
# engine's own sandboxed check, on the GPU.
#
# The image's python3 (Python 3.12) has a CUDA JAX but not the engine's other dependencies, and
# no bubblewrap. Both travel in .gpucheck/ (prepared here by `infra/gpu_engine_check.sh --prepare`,
# which needs PyPI and Debian's bwrap):
#   .gpucheck/whl/*.whl   pydantic and the rest, for cp312, installed into python3's own
#                         environment: sandboxed children see only the interpreter's site
#                         directories, never a PYTHONPATH folder
#   .gpucheck/bin/bwrap   Debian's bubblewrap, used where the machine has none
#   .gpucheck/lib/        its libraries and libseccomp, copied only where missing there
# Arguments go to gpu_engine_check.py.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
PY=${PYTHON:-python3}
CARRY=.gpucheck

if [ "${1:-}" = "--prepare" ]; then
    rm -rf "$CARRY/whl" "$CARRY/bin" "$CARRY/lib" && mkdir -p "$CARRY/whl" "$CARRY/bin" "$CARRY/lib"
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$CARRY/whl" \
        $(.venv/bin/python -m pip list --format=freeze 2>/dev/null |
            grep -iE '^(pydantic|pydantic[-_]core|annotated[-_]types|typing[-_]inspection|typing[-_]extensions|pyseccomp)==') ||
        exit 3
    cp "$(command -v bwrap)" "$CARRY/bin/" || exit 3
    for lib in libselinux.so.1 libcap.so.2 libpcre2-8.so.0 libseccomp.so.2; do
        cp -L "/lib/x86_64-linux-gnu/$lib" "$CARRY/lib/" || exit 3
    done
    du -sh "$CARRY"
    exit 0
fi

"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$CARRY"/whl/*.whl || exit 3
missing=0
for lib in "$CARRY"/lib/*; do
    ldconfig -p | grep -q "$(basename "$lib")" || { cp "$lib" /usr/local/lib/ && missing=1; }
done
[ "$missing" = 1 ] && ldconfig
if ! command -v bwrap >/dev/null; then
    install -m 0755 "$CARRY/bin/bwrap" /usr/local/bin/bwrap || exit 3
fi
bwrap --version
exec timeout -k 15 "${GPU_CHECK_TIMEOUT:-420}" "$PY" infra/gpu_engine_check.py "$@"
