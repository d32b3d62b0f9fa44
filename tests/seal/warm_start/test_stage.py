"""The warm-start stage: trains once, reuses after, points the run at the result, and keeps the
validation tasks (and by default the RL tasks) apart from the tasks it imitated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seal.config import ConfigError
from seal.trainer.tasks import select_task_ids
from seal.warm_start import prepare, stage

from .conftest import TASKS, notes_cfg


def _cfg(base: Path, out: Path, *extra: str):
    return notes_cfg(f"actor_rollout_ref.model.path={base}", f"seal.warm_start.output={out}",
                     "seal.warm_start.epochs=1", "seal.warm_start.lr=1e-3", *extra)


def test_the_stage_trains_once_then_reuses_the_checkpoint(tiny_model_dir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "warm"
    cfg = prepare(_cfg(tiny_model_dir, out))
    assert cfg.actor_rollout_ref.model.path == str(out)
    record = json.loads((out / stage.RECORD).read_text())
    assert record["task_ids"] == TASKS and record["steps"] == len(TASKS) and len(record["epoch_losses"]) == 1
    assert record["trainer_identity"] == "seal.warm_start.sft/cpu/none"
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    assert not (tmp_path / "warm.partial").exists()

    def no_training(*args, **kwargs):
        raise AssertionError("the stage trained again")

    monkeypatch.setattr(stage, "_train", no_training)
    assert prepare(_cfg(tiny_model_dir, out)).actor_rollout_ref.model.path == str(out)
    # Other hyperparameters: another fingerprint, and the folder is not silently overwritten.
    with pytest.raises(ConfigError, match="holds a different warm start"):
        prepare(_cfg(tiny_model_dir, out, "seal.warm_start.lr=2e-3"))


def test_off_by_default_and_in_the_paper_recipe() -> None:
    from seal.config import REPO_ROOT, compose_config

    cfg = compose_config(REPO_ROOT / "exp" / "SEAL.yaml")
    assert cfg.seal.warm_start.enable is False and prepare(cfg) is cfg


def test_validation_tasks_may_not_be_warm_start_tasks(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = _cfg(tiny_model_dir, tmp_path / "w", "seal.tasks.val_ids=[notes_020,notes_001]")
    with pytest.raises(ConfigError, match="notes_001 are also warm-start tasks"):
        prepare(cfg)


def test_only_training_tasks_can_be_imitated(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="notes_020 not in notes's train split"):
        prepare(_cfg(tiny_model_dir, tmp_path / "w", "seal.warm_start.task_ids=[notes_000,notes_020]"))


def test_rl_training_leaves_out_the_warm_start_tasks_unless_asked() -> None:
    kept = select_task_ids(notes_cfg("seal.tasks.max_train_tasks=null"), "train")
    assert not set(TASKS) & set(kept) and len(kept) == 60 - len(TASKS)
    # The first two training tasks (the notes example's cap) once the warm start's are left out.
    assert select_task_ids(notes_cfg(), "train") == ["notes_002", "notes_003"]
    assert select_task_ids(notes_cfg("seal.warm_start.exclude_from_rl=false"), "train") == ["notes_000", "notes_001"]
