"""Epoch boundaries: both backends hand the hooks the same per-step call (``after_step``), which
dumps the epoch's stats at its last step and keeps a run's window when it ends mid-epoch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from seal.trainer.coevolution import STATE_FILE, CoEvolution

sys.path.insert(0, str(Path(__file__).parent / "verl"))


def _spy(monkeypatch) -> list[tuple]:
    calls: list[tuple] = []
    real = CoEvolution.after_step

    def record(self, epoch, step, *, ends_epoch, last_step):
        calls.append((epoch, step, ends_epoch, last_step))
        return real(self, epoch, step, ends_epoch=ends_epoch, last_step=last_step)

    monkeypatch.setattr(CoEvolution, "after_step", record)
    return calls


def test_after_step_writes_what_each_boundary_needs(tmp_path, trainer_config):
    hooks = CoEvolution(trainer_config("hooks"), tmp_path)
    hooks.after_step(0, 1, ends_epoch=False, last_step=False)
    assert not hooks.stats_dir.exists() and not (hooks.state_dir / STATE_FILE).exists()
    hooks.after_step(0, 2, ends_epoch=False, last_step=True)  # the run ends mid-epoch: state kept
    assert (hooks.state_dir / STATE_FILE).is_file() and not hooks.stats_dir.exists()
    hooks.after_step(0, 2, ends_epoch=True, last_step=True)  # an epoch's end: stats dumped too
    assert (hooks.stats_dir / "epoch_0.json").is_file()


def test_local_trainer_calls_after_step_each_step(tmp_path, make_trainer, monkeypatch):
    calls = _spy(monkeypatch)
    # 4 tasks, 2 per step: 2 steps per epoch; 3 steps end the run in the middle of epoch 1.
    trainer, _ = make_trainer(tmp_path / "local", extra=["trainer.total_training_steps=3", "trainer.test_freq=0",
                                                         "trainer.save_freq=0", "trainer.val_before_train=false"])
    try:
        trainer.fit()
    finally:
        trainer.close()
    assert calls == [(0, 1, False, False), (0, 2, True, False), (1, 3, False, True)]


@pytest.fixture(scope="module")
def transfer_queue():
    """The TransferQueue verl's V1 trainer keeps each step's batch in (a small local Ray)."""
    pytest.importorskip("verl")
    from verl_testkit import transfer_queue_running

    with transfer_queue_running():
        yield


def test_verl_trainer_calls_after_step_the_same_way(tmp_path, monkeypatch, transfer_queue):
    from verl_testkit import make_step, make_trainer, run_step

    from seal.config import compose_config

    seal_cfg = compose_config("exp/SEAL.yaml")
    calls = _spy(monkeypatch)
    for step in (1, 2, 3):
        trainer = make_trainer(seal_cfg, tmp_path / f"s{step}", step=step, steps_per_epoch=2, total_steps=3)
        run_step(trainer, make_step())  # verl's V1 step; the SEAL step in its actor-update seam
    assert calls == [(0, 1, False, False), (0, 2, True, False), (1, 3, False, True)]
