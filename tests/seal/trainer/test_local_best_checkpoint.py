"""Best-validation-step checkpoints on the local trainer, as the release keeps them.

The scripted runner's validation verdicts are set per validation pass, so the best step is known:
the compared score is the ``multi_turn_base`` pass rate (the release's automatic choice), a tie
keeps the earlier step, the pass before training counts, and with keep-only-best only the best
and the latest checkpoint (the resume point) remain.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from seal.config import ConfigError

BEST = ["trainer.save_best_checkpoint=true", "trainer.keep_only_best_checkpoint=true"]


class ValidationScript:
    """The scripted runner (conftest), except that validation pass ``i`` passes
    ``multi_turn_base`` iff ``base[i]`` and the other category iff ``other[i]``."""

    def __init__(self, inner: Any, base: list[bool], other: list[bool]) -> None:
        self.inner, self.base, self.other = inner, base, other
        self.val_calls: dict[str, int] = {}

    async def run(self, sampling_params: dict, *, task_id: str, rollout_mode: str, env_params: dict,
                  **kwargs: Any) -> Any:
        out = await self.inner.run(sampling_params, task_id=task_id, rollout_mode=rollout_mode,
                                   env_params=env_params, **kwargs)
        if rollout_mode != "validate":
            return out
        i = self.val_calls[task_id] = self.val_calls.get(task_id, -1) + 1
        passed = (self.base if task_id.startswith("multi_turn_base") else self.other)[i]
        return self.inner.with_verdict(out, valid=passed)


def _run(make_trainer, scripted_runner, exp, extra, base, other):
    runner = ValidationScript(scripted_runner(), base, other)
    # 4 steps, validation before training and every step: 5 passes.
    trainer, _ = make_trainer(exp, extra=["trainer.total_training_steps=4", "trainer.test_freq=1",
                                          "trainer.val_before_train=true", *extra], runner=runner)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return trainer, exp / "checkpoints"


def _steps(root) -> list[int]:
    return sorted(int(p.name.rsplit("_", 1)[1]) for p in root.glob("global_step_*"))


def _metrics(exp) -> dict[int, dict]:
    rows = [json.loads(line) for line in (exp / "metrics.jsonl").read_text().splitlines()]
    return {int(r["step"]): r for r in rows}


@pytest.mark.slow
def test_keeps_the_best_base_step_and_the_latest(make_trainer, scripted_runner, tmp_path):
    exp = tmp_path / "best"
    # base pass rate per pass (steps 0..4): 0, 1, 0, 1 (a tie: step 1 stays), 0. The other
    # category peaks at step 2, which the release's automatic metric ignores.
    trainer, root = _run(make_trainer, scripted_runner, exp, [*BEST, "trainer.save_freq=0"],
                         base=[False, True, False, True, False], other=[False, False, True, False, False])

    marker = json.loads((root / "best_checkpoint.json").read_text())
    assert marker["global_step"] == 1 and marker["metric_name"] == "val/multi_turn_base/pass_rate"
    assert marker["metric_value"] == 1.0
    assert (root / "best_checkpoint_path.txt").read_text().strip() == str(root / "global_step_1")
    assert os.readlink(root / "best") == "global_step_1" and (root / "best" / "model.pt").is_file()
    # The best step and the last step (the resume point) remain; step 0, the first best, is gone.
    assert _steps(root) == [1, 4]
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "4"
    m = _metrics(exp)
    assert m[0]["best_checkpoint/saved"] == 1.0 and m[1]["best_checkpoint/saved"] == 1.0
    assert m[3]["best_checkpoint/saved"] == 0.0 and m[3]["best_checkpoint/best_step"] == 1.0
    assert m[1]["best_checkpoint/removed_non_best"] == 1.0  # global_step_0


@pytest.mark.slow
def test_configured_metric_and_keep_all(make_trainer, scripted_runner, tmp_path):
    exp = tmp_path / "overall"
    _, root = _run(make_trainer, scripted_runner, exp,
                   [*BEST, "trainer.keep_only_best_checkpoint=false", "trainer.best_checkpoint_metric=val/pass_rate",
                    "trainer.save_freq=1"],
                   base=[False, True, False, False, False], other=[False, False, True, True, False])
    marker = json.loads((root / "best_checkpoint.json").read_text())
    # val/pass_rate: 0, 0.5, 0.5 (tie), 0.5, 0 -> step 1.
    assert marker["global_step"] == 1 and marker["metric_name"] == "val/pass_rate"
    assert _steps(root) == [0, 1, 2, 3, 4]  # nothing deleted


@pytest.mark.slow
def test_resume_keeps_the_recorded_best(make_trainer, scripted_runner, tmp_path):
    exp = tmp_path / "resume"
    _run(make_trainer, scripted_runner, exp, [*BEST, "trainer.save_freq=1", "trainer.total_training_steps=2"],
         base=[False, True, False], other=[False] * 3)
    root = exp / "checkpoints"
    assert _steps(root) == [1, 2]
    # Resumed to 4 steps: steps 3 and 4 tie with the recorded 1.0 of step 1, so step 1 stays the
    # best; a keeper that forgot it on resume would take step 3.
    trainer, _ = _run(make_trainer, scripted_runner, exp, [*BEST, "trainer.save_freq=1"],
                      base=[True, True], other=[False] * 2)
    assert json.loads((root / "best_checkpoint.json").read_text())["global_step"] == 1
    assert _steps(root) == [1, 4]


def test_max_ckpt_to_keep_with_best_is_refused(make_trainer, tmp_path):
    with pytest.raises(ConfigError, match="trainer.max_actor_ckpt_to_keep"):
        make_trainer(tmp_path / "x", extra=[*BEST, "trainer.max_actor_ckpt_to_keep=1"])
