"""scripts/check_run_outputs.py (the GPU smoke's checker) on a real local-backend run folder:
two steps, a resume for a third, then the folder damaged one way at a time."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys

import pytest

import launcher
from seal.config import REPO_ROOT

spec = importlib.util.spec_from_file_location("check_run_outputs", REPO_ROOT / "scripts" / "check_run_outputs.py")
check_run_outputs = importlib.util.module_from_spec(spec)
sys.modules["check_run_outputs"] = check_run_outputs  # dataclasses look their module up there
spec.loader.exec_module(check_run_outputs)

# trainer_cfg: 4 training tasks, 2 per step (n=2: 4 episodes a step, 2 steps an epoch), 2
# validation tasks, validation before training, every 2 steps and at the last step, a checkpoint
# every step.
ARGS = ["--steps", "3", "--resumed-from", "2", "--val-steps", "0,2,3", "--ckpt-steps", "1,2,3",
        "--epochs", "0", "--episodes-per-step", "4", "--val-tasks", "2", "--backend", "local"]


def _fit(make_trainer, exp, extra):
    trainer, _ = make_trainer(exp, extra=extra)
    launcher.write_run_files(exp, trainer.cfg, extra, "exp/quickstart_bfcl.yaml")
    try:
        trainer.fit()
    finally:
        trainer.close()


def _check(exp, capsys, args=ARGS):
    rc = check_run_outputs.main([str(exp), *args])
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith(("PASS  ", "FAIL  ")) for line in lines)
    return rc, {line[6:].split(":")[0]: line[:4] for line in lines}, lines


@pytest.mark.slow
def test_checker_on_a_resumed_local_run(tmp_path, make_trainer, capsys):
    run = tmp_path / "smoke"
    keep = ["trainer.keep_only_best_checkpoint=false"]  # every step's checkpoint stays, as in gpu_smoke.yaml
    _fit(make_trainer, run, keep)
    _fit(make_trainer, run, [*keep, "trainer.total_training_steps=3", "trainer.total_epochs=2"])

    rc, status, lines = _check(run, capsys)
    assert rc == 0 and set(status.values()) == {"PASS"}, "\n".join(lines)
    assert {"validation log step 0", "validation log step 2", "validation log step 3", "checkpoint step 3",
            "epoch stats 0", "diagnosis state carried across the resume"} <= set(status)

    # Each damage fails its own check (and only that one) with exit status 1.
    def damaged(name, damage, args=ARGS):
        copy = tmp_path / name
        shutil.copytree(run, copy)
        damage(copy)
        rc, status, _ = _check(copy, capsys, args)
        assert rc == 1
        return {k for k, v in status.items() if v == "FAIL"}

    assert damaged("no_val", lambda d: (d / "validation_log" / "2.jsonl").unlink()) == {"validation log step 2"}
    assert damaged("no_ckpt_state", lambda d: (d / "checkpoints" / "global_step_1" / "seal" / "capability_state.json")
                   .unlink()) == {"checkpoint step 1", "diagnosis state per checkpoint"}

    def reset_after_resume(d):
        # What a resume that lost the diagnosis state would leave: step 3 holds one step's episodes.
        for path in (d / "checkpoints" / "global_step_3" / "seal" / "capability_state.json",
                     d / "diagnostic_state" / "capability_state.json"):
            state = json.loads(path.read_text())
            state["observe_count"] = 4
            path.write_text(json.dumps(state))

    assert damaged("reset", reset_after_resume) == {"diagnosis state per checkpoint",
                                                     "diagnosis state carried across the resume"}
    assert damaged("tracker", lambda d: (d / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2")) \
        == {"resume tracker"}
    wrong_step = [a if a != "0,2,3" else "0,1,2,3" for a in ARGS]
    assert damaged("asks_more", lambda d: None, wrong_step) == {"validation log step 1"}
    assert damaged("verl_files", lambda d: None, ARGS[:-1] + ["verl"]) == {
        "checkpoint step 1", "checkpoint step 2", "checkpoint step 3"}

    # The resume point is the run's own record, not the flag: without --resumed-from the check
    # still runs (from the step the trainer wrote), a flag that disagrees with the run fails, and
    # a run that never resumed has no resume to check.
    assert json.loads((run / "resumes.jsonl").read_text().splitlines()[-1])["resumed_from"] == 2
    unflagged = [a for i, a in enumerate(ARGS) if "--resumed-from" not in ARGS[max(0, i - 1):i + 1]]
    rc, status, _ = _check(run, capsys, unflagged)
    assert rc == 0 and status["diagnosis state carried across the resume"] == "PASS"
    other_step = [a if a != "2" or ARGS[i - 1] != "--resumed-from" else "1" for i, a in enumerate(ARGS)]
    assert damaged("flag_disagrees", lambda d: None, other_step) == {"diagnosis state carried across the resume"}
    assert damaged("never_resumed", lambda d: (d / "resumes.jsonl").unlink()) == {
        "diagnosis state carried across the resume"}


def test_checker_on_a_missing_folder(tmp_path, capsys):
    assert check_run_outputs.main([str(tmp_path / "none"), *ARGS]) == 1
    assert capsys.readouterr().out.startswith("FAIL  experiment folder")
