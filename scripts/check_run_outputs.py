"""Check what a training run wrote to its experiment folder, one PASS/FAIL line per check.

    python scripts/check_run_outputs.py experiments/gpu_smoke --steps 3 --resumed-from 2 \
        --val-steps 0,2,3 --ckpt-steps 1,2,3 --epochs 0,1,2 --episodes-per-step 16 --val-tasks 8 --backend verl

Checks: the run files (config, overrides, commit); one validation log per expected step, every
line a well-formed record of that step, one per validation task; the capability state (live file
and one per checkpoint, observe_count growing step by step); the epoch statistics; the checkpoint
folders ``checkpoints/global_step_<k>/`` with SEAL's ``seal/`` state and the backend's own files;
the resume tracker; for a run that resumed (its ``resumes.jsonl``), the diagnosis state carried
across the resume from the step the run recorded (``--resumed-from`` asserts that step).
Exit status 0 when every check passes, 1 otherwise. Works on both backends' folders
(scripts/gpu_smoke.sh runs it on a verl run; the tests on a local-backend run).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_FILE = "capability_state.json"
TRACKER = "latest_checkpointed_iteration.txt"
RESUMES_FILE = "resumes.jsonl"  # written by the trainers on resume (seal.trainer.coevolution.RESUMES_FILE)
# What each backend's checkpoint holds besides seal/: verl's FSDP actor shards, the local
# trainer's model weights and trainer state.
BACKEND_CKPT_FILES = {"verl": ["actor"], "local": ["trainer_state.json"]}


class CheckFailed(Exception):
    """One check's reason for failing."""


@dataclass
class Expectations:
    steps: int
    val_steps: list[int]
    ckpt_steps: list[int]
    epochs: list[int]
    resumed_from: int | None = None
    episodes_per_step: int | None = None
    val_tasks: int | None = None
    backend: str | None = None


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise CheckFailed(f"{path} is missing")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckFailed(f"{path} is not valid JSON ({exc})") from exc


def _observe_count(path: Path) -> int:
    state = _read_json(path)
    if not isinstance(state.get("observe_count"), int):
        raise CheckFailed(f"{path} has no integer observe_count")
    return state["observe_count"]


def check_run_files(exp: Path) -> str:
    missing = [n for n in ("config.yaml", "overrides.txt", "git_commit.txt") if not (exp / n).is_file()]
    if missing:
        raise CheckFailed(f"missing in {exp}: {', '.join(missing)}")
    return "config.yaml, overrides.txt, git_commit.txt"


def check_validation_log(exp: Path, step: int, val_tasks: int | None) -> str:
    path = exp / "validation_log" / f"{step}.jsonl"
    if not path.is_file():
        raise CheckFailed(f"{path} is missing")
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not lines:
        raise CheckFailed(f"{path} is empty")
    task_ids, scores = [], []
    for i, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CheckFailed(f"{path}:{i} is not JSON ({exc})") from exc
        if not isinstance(rec, dict) or not rec.get("task_id") or not isinstance(rec.get("score"), (int, float)):
            raise CheckFailed(f"{path}:{i} lacks a task_id or a numeric score")
        if rec.get("step") != step:
            raise CheckFailed(f"{path}:{i} has step {rec.get('step')!r}, expected {step}")
        task_ids.append(rec["task_id"])
        scores.append(float(rec["score"]))
    if val_tasks is not None and len(set(task_ids)) != val_tasks:
        raise CheckFailed(f"{path}: {len(set(task_ids))} distinct tasks, expected {val_tasks}")
    return f"{len(lines)} episodes, {len(set(task_ids))} tasks, mean score {sum(scores) / len(scores):.3f}"


def check_capability_state(exp: Path, steps: int) -> str:
    path = exp / "diagnostic_state" / STATE_FILE
    state = _read_json(path)
    count = _observe_count(path)
    if count <= 0:
        raise CheckFailed(f"{path}: observe_count is {count}: no training episode was observed")
    if state.get("last_step") != steps:
        raise CheckFailed(f"{path}: last_step is {state.get('last_step')!r}, expected {steps}")
    return f"observe_count {count}, last_step {steps}, {len(state.get('tasks') or {})} tasks"


def check_epoch_stats(exp: Path, epoch: int) -> str:
    path = exp / "diagnostic_stats" / f"epoch_{epoch}.json"
    dump = _read_json(path)
    if dump.get("epoch") != epoch or not dump.get("tasks"):
        raise CheckFailed(f"{path}: epoch {dump.get('epoch')!r} with {len(dump.get('tasks') or {})} tasks")
    return f"global_step {dump.get('global_step')}, {len(dump['tasks'])} tasks, observe_count {dump.get('observe_count')}"


def check_checkpoint(exp: Path, step: int, backend: str | None) -> str:
    folder = exp / "checkpoints" / f"global_step_{step}"
    if not folder.is_dir():
        raise CheckFailed(f"{folder} is missing")
    count = _observe_count(folder / "seal" / STATE_FILE)
    missing = [n for n in BACKEND_CKPT_FILES.get(backend or "", []) if not (folder / n).exists()]
    if missing:
        raise CheckFailed(f"{folder}: no {', '.join(missing)} ({backend} backend)")
    return f"{folder.relative_to(exp)}/seal/{STATE_FILE} (observe_count {count})"


def check_tracker(exp: Path, steps: int) -> str:
    path = exp / "checkpoints" / TRACKER
    if not path.is_file():
        raise CheckFailed(f"{path} is missing")
    text = path.read_text(encoding="utf-8").strip()
    if text != str(steps):
        raise CheckFailed(f"{path} says {text!r}, expected {steps}")
    return f"{TRACKER} = {steps}"


def check_diagnosis_growth(exp: Path, ex: Expectations) -> str:
    """observe_count grows at every checkpoint, and the live state matches the last one."""
    counts = [(k, _observe_count(exp / "checkpoints" / f"global_step_{k}" / "seal" / STATE_FILE))
              for k in sorted(ex.ckpt_steps)]
    for (k0, c0), (k1, c1) in zip(counts, counts[1:]):
        if c1 <= c0:
            raise CheckFailed(f"observe_count {c0} at step {k0}, {c1} at step {k1}: it did not grow")
    if ex.episodes_per_step is not None:
        for k, c in counts:
            if c > k * ex.episodes_per_step:
                raise CheckFailed(f"observe_count {c} at step {k}: more than {ex.episodes_per_step} per step")
    live = _observe_count(exp / "diagnostic_state" / STATE_FILE)
    if counts and live != counts[-1][1]:
        raise CheckFailed(f"the live state's observe_count {live} differs from the last checkpoint's {counts[-1][1]}")
    return " -> ".join(f"{c} (step {k})" for k, c in counts)


def resume_point(exp: Path) -> int | None:
    """The step the run last resumed from, as the trainer recorded it (``resumes.jsonl``); None
    for a run that never resumed."""
    path = exp / RESUMES_FILE
    if not path.is_file():
        return None
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    try:
        return int(json.loads(lines[-1])["resumed_from"]) if lines else None
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckFailed(f"{path}: not a resume record ({exc})") from exc


def check_resume_carried(exp: Path, ex: Expectations) -> str:
    """After resuming at step R (the run's own record), the state holds more than the resumed
    steps alone could observe. ``--resumed-from``, when given, must agree with the record."""
    r, last = resume_point(exp), ex.steps
    if r is None:
        raise CheckFailed(f"{exp / RESUMES_FILE} is missing: the run never resumed")
    if ex.resumed_from is not None and ex.resumed_from != r:
        raise CheckFailed(f"the run resumed from step {r}, not from step {ex.resumed_from}")
    before = _observe_count(exp / "checkpoints" / f"global_step_{r}" / "seal" / STATE_FILE)
    after = _observe_count(exp / "checkpoints" / f"global_step_{last}" / "seal" / STATE_FILE)
    if after <= before:
        raise CheckFailed(f"observe_count {before} at the resume point (step {r}), {after} at step {last}")
    if ex.episodes_per_step is not None and after <= ex.episodes_per_step * (last - r):
        raise CheckFailed(f"observe_count {after} at step {last} is no more than {last - r} resumed step(s) "
                          f"observe: the state before the resume was lost")
    return f"observe_count {before} at step {r} -> {after} at step {last}"


def checks(exp: Path, ex: Expectations) -> Iterator[tuple[str, Callable[[], str]]]:
    yield "run files", lambda: check_run_files(exp)
    for s in ex.val_steps:
        yield f"validation log step {s}", lambda s=s: check_validation_log(exp, s, ex.val_tasks)
    yield "capability state", lambda: check_capability_state(exp, ex.steps)
    for e in ex.epochs:
        yield f"epoch stats {e}", lambda e=e: check_epoch_stats(exp, e)
    for k in ex.ckpt_steps:
        yield f"checkpoint step {k}", lambda k=k: check_checkpoint(exp, k, ex.backend)
    yield "resume tracker", lambda: check_tracker(exp, ex.steps)
    yield "diagnosis state per checkpoint", lambda: check_diagnosis_growth(exp, ex)
    if ex.resumed_from is not None or (exp / RESUMES_FILE).is_file():
        yield "diagnosis state carried across the resume", lambda: check_resume_carried(exp, ex)


def run_checks(exp: Path, ex: Expectations, out: Callable[[str], None]) -> bool:
    """Print one ``PASS``/``FAIL`` line per check through ``out``; True when all passed."""
    ok = True
    for name, check in checks(Path(exp), ex):
        try:
            out(f"PASS  {name}: {check()}")
        except CheckFailed as exc:
            ok = False
            out(f"FAIL  {name}: {exc}")
    return ok


def _steps(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("exp_dir", type=Path, help="experiments/<name>")
    p.add_argument("--steps", type=int, required=True, help="the last training step")
    p.add_argument("--val-steps", type=_steps, required=True, help="steps with a validation log, e.g. 0,2,3")
    p.add_argument("--ckpt-steps", type=_steps, required=True, help="steps with a checkpoint folder, e.g. 1,2,3")
    p.add_argument("--epochs", type=_steps, default=[], help="epochs with a statistics file, e.g. 0,1")
    p.add_argument("--resumed-from", type=int,
                   help="the step the run must have resumed from (default: whatever the run recorded)")
    p.add_argument("--episodes-per-step", type=int, help="training episodes per step (tasks x n)")
    p.add_argument("--val-tasks", type=int, help="validation tasks per validation")
    p.add_argument("--backend", choices=sorted(BACKEND_CKPT_FILES), help="also check the backend's checkpoint files")
    a = p.parse_args(argv)
    if not a.exp_dir.is_dir():
        print(f"FAIL  experiment folder: {a.exp_dir} does not exist")
        return 1
    ex = Expectations(steps=a.steps, val_steps=a.val_steps, ckpt_steps=a.ckpt_steps, epochs=a.epochs,
                      resumed_from=a.resumed_from, episodes_per_step=a.episodes_per_step,
                      val_tasks=a.val_tasks, backend=a.backend)
    ok = run_checks(a.exp_dir, ex, lambda line: print(line, flush=True))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
