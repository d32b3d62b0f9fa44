"""scripts/weight_change.py: the movement it reports, and its AdamW noise reference."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import weight_change as wc  # noqa: E402


def test_one_adam_step_moves_every_parameter_by_lr_and_noise_moves_less_than_a_kept_sign() -> None:
    assert abs(wc.adam_noise_median(1, (0.9, 0.999)) - 1.0) < 1e-3
    three = wc.adam_noise_median(3, (0.9, 0.999))
    assert 1.0 < three < 3.0
    assert wc.adam_noise_median(7, (0.9, 0.999)) > three


def test_movement_reads_both_checkpoint_formats_in_units_of_lr(tmp_path: Path) -> None:
    before = {"model.layers.0.w": torch.zeros(4, 5), "lm_head.weight": torch.ones(3)}
    after = {"model.layers.0.w": torch.full((4, 5), 2e-5), "lm_head.weight": torch.ones(3)}
    ckpt = tmp_path / "global_step_3"
    ckpt.mkdir()
    torch.save(after, ckpt / "model.pt")
    from safetensors.torch import save_file

    hf = tmp_path / "hf"
    hf.mkdir()
    save_file(before, str(hf / "model.safetensors"))
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "weight_change.py"), str(hf), str(ckpt),
                          "--lr", "4e-5", "--updates", "1"], capture_output=True, text=True, check=True).stdout
    # 20 of the 23 parameters moved half a step; the median parameter moved 0.5 lr.
    assert "moved >= 0.5 lr: 0.870" in out, out
    assert "50%: 0.50" in out and "a sign kept every step gives 1.00 lr" in out, out


def test_a_folder_without_weights_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "weight_change.py"), str(tmp_path), str(tmp_path),
                           "--lr", "1e-4"], capture_output=True, text=True)
    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0 and "no model.pt or *.safetensors" in done.stderr
