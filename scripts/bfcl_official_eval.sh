#!/usr/bin/env bash
# Score a validation log with BFCL's official `bfcl evaluate` and compare with our verdicts.
#
#   scripts/bfcl_official_eval.sh LOG.jsonl [WORKDIR]     # a log written by `seal eval` / the trainer
#   scripts/bfcl_official_eval.sh --selftest [N]          # oracle + perturbed trajectories, N per category
#
# bfcl-eval's CLI goes into a throwaway venv under .bench/bfcl-official/venv, never into the
# project's .venv: it needs bfcl-eval's declared dependencies except sentence-transformers (which
# pulls a multi-GB CUDA torch and is only used by BFCL's memory category), plus soundfile (imported
# by qwen-agent but not declared). The script refuses to go on if torch ends up installed there.
# The log is exported as FC result files (model name gpt-4o-2024-11-20-FC), scored with
# --partial-eval, and every entry's (valid, error_type) is compared with the log's.
set -euo pipefail
cd "$(dirname "$0")/.."
PROJECT_PY=${PROJECT_PY:-.venv/bin/python}
BENCH=.bench/bfcl-official
VENV=$BENCH/venv
BFCL_VERSION=2026.3.23
MODEL=gpt-4o-2024-11-20-FC

if [ "${1:-}" = "--selftest" ]; then
  PER_CAT=${2:-20}
  WORK=$BENCH/selftest
  rm -rf "$WORK"
  mkdir -p "$WORK/log"
  "$PROJECT_PY" -m seal.eval.roundtrip --log-dir "$WORK/log" --per-category "$PER_CAT"
  LOG=$WORK/log/0.jsonl
elif [ $# -ge 1 ]; then
  LOG=$1
  WORK=${2:-$BENCH/run}
  rm -rf "$WORK/result" "$WORK/score"
else
  sed -n '2,12p' "$0"
  exit 2
fi
[ -f "$LOG" ] || { echo "bfcl_official_eval: log $LOG not found" >&2; exit 2; }

if [ ! -f "$VENV/.ready" ]; then
  echo "creating the bfcl-eval CLI venv in $VENV (about a minute, ~700 MB)"
  rm -rf "$VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q --no-deps "bfcl-eval==$BFCL_VERSION"
  # The declared requirements, minus sentence-transformers and extras, read from the metadata.
  "$VENV/bin/python" - > "$BENCH/requirements.txt" <<'PY'
import importlib.metadata as md
for req in md.requires("bfcl-eval") or []:
    if "extra ==" in req or req.lower().startswith("sentence-transformers"):
        continue
    print(req.split(";")[0].strip())
PY
  echo "soundfile" >> "$BENCH/requirements.txt"
  "$VENV/bin/python" -m pip install -q -r "$BENCH/requirements.txt"
  if "$VENV/bin/python" -m pip show torch >/dev/null 2>&1; then
    echo "bfcl_official_eval: torch was pulled into $VENV; refusing to continue" >&2
    exit 1
  fi
  touch "$VENV/.ready"
fi

mkdir -p "$WORK"
"$PROJECT_PY" -m seal.cli --log-level WARNING export-bfcl --log "$LOG" --out "$WORK" --bfcl-model "$MODEL"
WORK_ABS=$(cd "$WORK" && pwd)
( cd "$WORK_ABS" && BFCL_PROJECT_ROOT="$WORK_ABS" OPENAI_API_KEY=dummy \
    "$OLDPWD/$VENV/bin/bfcl" evaluate --model "$MODEL" --test-category multi_turn --partial-eval \
    > "$WORK_ABS/bfcl_evaluate.log" 2>&1 ) || { tail -30 "$WORK/bfcl_evaluate.log" >&2; exit 1; }
[ -f "$WORK/score/data_multi_turn.csv" ] && { cat "$WORK/score/data_multi_turn.csv"; echo; }
"$PROJECT_PY" -m seal.cli --log-level WARNING compare-bfcl --log "$LOG" --root "$WORK" --bfcl-model "$MODEL"
