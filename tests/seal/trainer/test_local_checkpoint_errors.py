"""A damaged local checkpoint fails the resume with one line naming the file and the way out."""

from __future__ import annotations

import pytest
import torch

from seal.config import ConfigError
from seal.trainer.coevolution import CoEvolution
from seal.trainer.local import checkpoint as ckpt


@pytest.fixture
def saved(tmp_path, trainer_config):
    cfg = trainer_config("ck")
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    hooks = CoEvolution(cfg, tmp_path)
    root = tmp_path / "checkpoints"
    state = {"global_step": 1, "data": {"epoch": 0, "index": 2, "seed": 1, "num_tasks": 4}}
    ckpt.save_checkpoint(root, 1, model=model, optimizer=optimizer, trainer_state=state, coevolution=hooks)
    return root, model, optimizer, hooks


def _load(root, model, optimizer, hooks):
    return ckpt.load_checkpoint(ckpt.latest_checkpoint(root), model=model, optimizer=optimizer, coevolution=hooks)


def test_intact_checkpoint_loads(saved):
    assert _load(*saved)["global_step"] == 1


@pytest.mark.parametrize("name", ["model.pt", "optimizer.pt", "rng.pt", "trainer_state.json"])
def test_damaged_file_is_named_with_the_way_out(saved, name):
    root = saved[0]
    target = root / "global_step_1" / name
    target.write_bytes(target.read_bytes()[:20])
    with pytest.raises(ConfigError) as info:
        _load(*saved)
    message = str(info.value)
    assert message.startswith(f"{target}: damaged checkpoint, cannot resume")
    assert "trainer.resume_mode=disable" in message and "\n" not in message


def test_damaged_tracker_is_named(saved):
    root = saved[0]
    (root / "latest_checkpointed_iteration.txt").write_text("\x00garbage")
    with pytest.raises(ConfigError, match="latest_checkpointed_iteration.txt: damaged checkpoint tracker"):
        ckpt.latest_checkpoint(root)
