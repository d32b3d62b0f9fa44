"""Kill after a checkpoint, resume, and continue exactly as an uninterrupted run would.

The "kill" is simulated: a run raises right after its step-1 checkpoint, then fresh trainer
objects (a new model, optimizer, sampler and hooks) resume from the folder. The scripted runner
draws its tokens, rewards and tags from torch's global RNG, so the resumed run matches the
uninterrupted one only if model, optimizer, RNG, data position and diagnosis state all come back.
"""

from __future__ import annotations

import json

import pytest
import torch

from seal.trainer.coevolution import HOOKS_FILE, STATE_FILE


class _Killed(Exception):
    """Stands for the process being killed right after its first checkpoint."""


def _fit(make_trainer, exp, extra):
    trainer, runner = make_trainer(exp, extra=extra)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return trainer, runner


def _train_tasks(runner):
    return [c["task_id"] for c in runner.calls if c["rollout_mode"] == "sample"]


@pytest.mark.slow
def test_resume_continues_exactly(tmp_path, make_trainer):
    full, full_runner = _fit(make_trainer, tmp_path / "full", [])

    part = tmp_path / "part"
    first, first_runner = make_trainer(part)
    real_save = first.save

    def save_then_die():
        real_save()
        if first.global_step == 1:  # the step-0 save is the best-validation-step checkpoint
            raise _Killed

    first.save = save_then_die
    with pytest.raises(_Killed):
        first.fit()
    first.close()
    ckpt1 = part / "checkpoints" / "global_step_1"
    saved_state = {name: (ckpt1 / "seal" / name).read_bytes() for name in (STATE_FILE, HOOKS_FILE)}
    assert json.loads((ckpt1 / "trainer_state.json").read_text())["data"]["index"] == 2

    resumed, resumed_runner = make_trainer(part)  # resume_mode=auto picks global_step_1
    try:
        assert resumed.maybe_resume()
        assert resumed.global_step == 1
        # The diagnosis state and the reweighter's state came back byte for byte.
        resumed.coevolution.save(tmp_path / "reloaded")
        assert {name: (tmp_path / "reloaded" / name).read_bytes() for name in saved_state} == saved_state
        assert resumed.coevolution.reweighter_state["tag_weights"]  # A-Patch's dynamic weights
        resumed.fit()  # fit() resumes again from the same checkpoint, then runs step 2
    finally:
        resumed.close()

    # Same data order: step 1 in the first process, step 2 in the resumed one.
    assert _train_tasks(first_runner) + _train_tasks(resumed_runner) == _train_tasks(full_runner)
    # No validation before training on resume; the step-2 validation ran.
    assert [c["rollout_mode"] for c in resumed_runner.calls].count("validate") == 2
    # Identical weights and diagnosis state at the end.
    a, b = full.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    for name in (STATE_FILE, HOOKS_FILE):
        end_full = (tmp_path / "full" / "checkpoints" / "global_step_2" / "seal" / name).read_bytes()
        end_part = (part / "checkpoints" / "global_step_2" / "seal" / name).read_bytes()
        assert end_full == end_part
    # metrics.jsonl continues (steps 0, 1 from the first process, 2 from the resumed one).
    steps = [json.loads(x)["step"] for x in (part / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]


def test_resume_disable_starts_over(tmp_path, make_trainer):
    _fit(make_trainer, tmp_path / "run", ["trainer.total_training_steps=1"])
    trainer, runner = make_trainer(tmp_path / "run", extra=["trainer.resume_mode=disable",
                                                            "trainer.total_training_steps=1"])
    try:
        assert not trainer.maybe_resume()
        assert trainer.global_step == 0 and trainer.coevolution.state.observe_count == 0
    finally:
        trainer.close()
