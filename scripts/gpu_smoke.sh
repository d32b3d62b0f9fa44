#!/usr/bin/env bash
# GPU smoke: train exp/gpu_smoke.yaml for two steps into a fresh experiment folder, resume it for a
# third step, then check every output (scripts/check_run_outputs.py: one PASS/FAIL line per check).
#
#   bash scripts/gpu_smoke.sh [--cpu | --backend verl|local] [--name NAME] [--out DIR] [--model PATH]
#                             [--port PORT] [--phase all|train|resume] [-- key=value ...]
#
#   --backend  verl (default; one CUDA GPU, install.sh --gpu) or local: the same two steps, resume
#              and checks on the CPU with the local backend and quickstart-sized settings
#              (also SMOKE_BACKEND=local)
#   --cpu      the verl backend on this machine's CPU (exp/verl_cpu.yaml): verl's own fit() on a
#              local Ray cluster, FSDP2 workers on gloo, the seal_cpu rollout (also SMOKE_BACKEND=cpu)
#   --name     experiment name, a folder that must not exist yet (default gpu_smoke_<date>_<time>)
#   --out      where the logs and timings go (default experiments/<name>)
#   --model    actor_rollout_ref.model.path (default: the config's, models/SmolLM2-135M-Instruct)
#   --port     the environment service's port (default: the config's, 8082)
#   --phase    all (default); train: only the first run (two steps); resume: only the resumed run
#              and the checks, on the experiment --name that a train phase left (for a machine
#              that cannot hold one call for both runs)
#   after --   more Hydra overrides for both runs
#
# Runs in the current folder (experiments/<name>/ is created there); PYTHON picks the interpreter
# (default: the project's .venv). Exit status: 0 when both runs and every check passed, 1 when one
# failed, 2 for a bad option.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CONF="$ROOT/exp/gpu_smoke.yaml"
BACKEND=${SMOKE_BACKEND:-verl}
NAME=""
OUT=""
MODEL=""
PORT=""
PHASE=all
EXTRA=()

die() { echo "gpu_smoke: error: $*" >&2; exit 1; }
usage_error() { echo "gpu_smoke: $* (see: bash scripts/gpu_smoke.sh --help)" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --backend|--name|--out|--model|--port|--phase)
      [ $# -ge 2 ] || usage_error "$1 needs a value"
      case "$1" in
        --backend) BACKEND=$2 ;; --name) NAME=$2 ;; --out) OUT=$2 ;; --model) MODEL=$2 ;; --port) PORT=$2 ;;
        --phase) PHASE=$2 ;;
      esac
      shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    --cpu) BACKEND=cpu; shift ;;
    -h|--help) sed -n 2,24p "$0"; exit 0 ;;
    *) usage_error "unknown option '$1'" ;;
  esac
done
case "$BACKEND" in verl|local) ;; cpu) CONF="$ROOT/exp/verl_cpu.yaml" ;;
  *) usage_error "--backend $BACKEND: choose verl or local (or --cpu)" ;; esac
[ -z "$PORT" ] || [[ "$PORT" =~ ^[0-9]+$ ]] || usage_error "--port $PORT: expected a number"
case "$PHASE" in all|train) ;; resume) [ -n "$NAME" ] || usage_error "--phase resume needs the train phase's --name" ;;
  *) usage_error "--phase $PHASE: choose all, train or resume" ;; esac

PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || command -v "$PY" >/dev/null || die "no Python at $PY: run bash install.sh first (or set PYTHON)"

if [ "$BACKEND" = verl ]; then
  "$PY" -c "import vllm, verl" >/dev/null 2>&1 \
    || die "vLLM/verl do not import in $PY: run bash install.sh --gpu first"
  "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1 \
    || die "torch sees no CUDA GPU: run bash install.sh --gpu first, on a machine with an NVIDIA GPU" \
           "(or use --backend local)"
fi

NAME=${NAME:-gpu_smoke_$(date +%Y%m%d_%H%M%S)}
EXP="experiments/$NAME"
if [ "$PHASE" = resume ]; then
  [ -d "$EXP" ] || die "$EXP does not exist: run --phase train --name $NAME first"
else
  [ ! -e "$EXP" ] || die "$EXP already exists: give a new --name (the smoke needs a fresh experiment folder)"
fi

OVERRIDES=("trainer.experiment_name=$NAME")
[ -z "$MODEL" ] || OVERRIDES+=("actor_rollout_ref.model.path=$MODEL")
[ -z "$PORT" ] || OVERRIDES+=("env_service.url=http://127.0.0.1:$PORT")
if [ "$BACKEND" = local ]; then
  # The quickstart's scale on the CPU: one task a step played twice, one validation task, one
  # model call of a few tokens per episode; still two steps, validation, a checkpoint per step
  # and a resume.
  OVERRIDES+=(trainer.backend=local seal.local.device=cpu seal.local.tensorboard=false
              seal.local.progress_bars=false data.train_batch_size=1 actor_rollout_ref.rollout.n=2
              actor_rollout_ref.actor.ppo_mini_batch_size=1 seal.tasks.max_train_tasks=1
              seal.tasks.max_val_tasks=1 seal.rollout.max_llm_calls=1 seal.rollout.max_tokens_per_call=8)
fi
OVERRIDES+=(${EXTRA[@]+"${EXTRA[@]}"})
# verl validates again after loading a checkpoint (val_before_train); the resumed step 2 was
# validated before the stop, so the resume skips it.
RESUME=(trainer.total_training_steps=3 trainer.resume_mode=auto trainer.val_before_train=false)

# What the two runs must leave behind, from the composed config (this also validates it before
# anything heavy starts): the steps with a validation log and a checkpoint, the finished epochs,
# the episodes per step and the validation tasks.
PLAN=$("$PY" - "$ROOT" "$CONF" "${OVERRIDES[@]}" <<'EOF'
import logging, sys
sys.path.insert(0, sys.argv[1])  # this checkout's seal, as launcher.py imports it
logging.disable(logging.WARNING)
from seal.config import ConfigError, compose_config
try:
    cfg = compose_config(sys.argv[2], sys.argv[3:])
except ConfigError as exc:
    sys.exit(f"gpu_smoke: error: {exc}")
t, tasks = cfg.trainer, cfg.seal.tasks
if int(t.total_training_steps or 0) != 2 or int(t.save_freq or 0) <= 0:
    sys.exit("gpu_smoke: error: the smoke runs trainer.total_training_steps=2 with trainer.save_freq > 0")
last = (2, 3)
test_freq = int(t.test_freq or 0)
val = ([0] if t.val_before_train else []) + [
    k for k in (1, 2, 3) if test_freq > 0 and (k % test_freq == 0 or k in last)]
ckpt = [k for k in (1, 2, 3) if k % int(t.save_freq) == 0 or k in last]
batch = int(cfg.data.train_batch_size)
def count(ids, limit):
    # Without listed ids the environment's split is used, cut to the limit when one is set.
    if not ids:
        return int(limit) if limit else None
    return len(list(ids)[: int(limit)] if limit else list(ids))
n_train = count(tasks.train_ids, tasks.max_train_tasks)
per_epoch = n_train // batch if n_train else 0
epochs = list(range(3 // per_epoch)) if per_epoch else []
n_val = count(tasks.val_ids, tasks.max_val_tasks)
join = lambda xs: ",".join(map(str, xs)) or "-"
print(join(val), join(ckpt), join(epochs), batch * int(cfg.actor_rollout_ref.rollout.n), n_val or "-")
EOF
) || exit 1
OUT=${OUT:-$EXP}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# Everything this script prints also goes to the log folder, to be copied back from a GPU machine.
exec > >(tee -a "$OUT/smoke.log") 2>&1
read -r VAL_STEPS CKPT_STEPS EPOCHS EPISODES VAL_TASKS <<<"$PLAN"

# follow LOG MARKS: copy stdin to the terminal and LOG; note in MARKS the seconds since start at
# which each step's metrics line appears (verl's console "step:N - ...", the local "step N | ...").
follow() {
  local log=$1 marks=$2 start=${EPOCHREALTIME//[^0-9]/} line us
  while IFS= read -r line || [ -n "$line" ]; do
    printf '%s\n' "$line"
    printf '%s\n' "$line" >>"$log"
    if [[ $line =~ step[:\ ]([0-9]+)(\ -\ |\ \|\ |$) ]]; then
      us=$(( ${EPOCHREALTIME//[^0-9]/} - start ))
      printf '%s %d.%d\n' "${BASH_REMATCH[1]}" $((us / 1000000)) $((us / 100000 % 10)) >>"$marks"
    fi
  done
}

WALL=()
# phase NAME OVERRIDE...: one launcher run, its output followed into $OUT/smoke_<NAME>.log.
phase() {
  local name=$1; shift
  local log="$OUT/smoke_$name.log" marks="$OUT/smoke_$name.marks" rc=0 t0=$SECONDS
  : >"$log"; : >"$marks"
  echo "== $name: python launcher.py --conf ${CONF#"$ROOT"/} --with-env -- $*"
  "$PY" "$ROOT/launcher.py" --conf "$CONF" --with-env -- "$@" 2>&1 | follow "$log" "$marks" || rc=$?
  WALL+=("$name $((SECONDS - t0))")
  if [ "$rc" != 0 ]; then
    echo "FAIL  $name run: the launcher exited with status $rc (log: $log)"
    exit 1
  fi
}

# timings: per run, its wall time, when the first metrics line came (start-up plus the
# validation before training), and each step's own time as the backend measured it.
timings() {
  local entry name wall log first_step first_s
  echo "== timings (seconds)"
  for entry in "${WALL[@]}"; do
    read -r name wall <<<"$entry"
    log="$OUT/smoke_$name.log"
    first_step=""; first_s=""
    [ ! -s "$OUT/smoke_$name.marks" ] || read -r first_step first_s <"$OUT/smoke_$name.marks"
    echo "$name: wall $wall${first_step:+; first metrics line (step $first_step) $first_s after launch}"
    [ -f "$log" ] || continue
    { grep -E 'step:[0-9]+ - |step [0-9]+ \| ' "$log" || true; } | while IFS= read -r line; do
      [[ $line =~ step[:\ ]([0-9]+) ]] || continue
      local step=${BASH_REMATCH[1]} parts
      parts=$({ grep -oE 'timing_s/[a-z_]+:[0-9.]+(e[-+]?[0-9]+)?|\| s=[0-9.]+' <<<"$line" || true; } \
              | sed 's/^| s=/step:/; s/^timing_s\///' | tr '\n' ' ')
      [ -z "$parts" ] || echo "  step $step: $parts"
    done
  done
}

T0=$SECONDS
echo "gpu_smoke: backend $BACKEND, experiment $EXP, logs in $OUT"
echo "gpu_smoke: expecting validation at steps $VAL_STEPS, checkpoints at $CKPT_STEPS, epoch stats $EPOCHS," \
     "$EPISODES training episodes a step, $VAL_TASKS validation tasks"
[ "$PHASE" = resume ] || phase train "${OVERRIDES[@]}"
if [ "$PHASE" = train ]; then
  timings | tee "$OUT/smoke_timings.txt"
  echo "gpu_smoke: train phase done in $((SECONDS - T0)) s; next: bash scripts/gpu_smoke.sh --phase resume --name $NAME" \
       "(with the same options)"
  exit 0
fi
phase resume "${OVERRIDES[@]}" "${RESUME[@]}"

CHECK=("$EXP" --steps 3 --val-steps "$VAL_STEPS" --ckpt-steps "$CKPT_STEPS"
       --episodes-per-step "$EPISODES" --backend "${BACKEND/cpu/verl}")
[ "$EPOCHS" = - ] || CHECK+=(--epochs "$EPOCHS")
[ "$VAL_TASKS" = - ] || CHECK+=(--val-tasks "$VAL_TASKS")
echo "== checks: python scripts/check_run_outputs.py ${CHECK[*]}"
t0=$SECONDS
rc=0
"$PY" "$ROOT/scripts/check_run_outputs.py" "${CHECK[@]}" 2>&1 | tee "$OUT/smoke_check.log" || rc=$?
WALL+=("check $((SECONDS - t0))")
# A resume phase adds its timings to those its train phase wrote.
if [ "$PHASE" = resume ]; then timings | tee -a "$OUT/smoke_timings.txt"; else timings | tee "$OUT/smoke_timings.txt"; fi
if [ "$rc" != 0 ]; then
  echo "gpu_smoke: FAILED ($(grep -c '^FAIL' "$OUT/smoke_check.log") failing checks, $((SECONDS - T0)) s); logs in $OUT"
  exit 1
fi
echo "gpu_smoke: all checks passed in $((SECONDS - T0)) s; logs in $OUT"
