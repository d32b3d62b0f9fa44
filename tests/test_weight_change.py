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
    one = wc.adam_noise_quantiles(1, (0.9, 0.999))
    assert all(abs(q - 1.0) < 1e-3 for q in one), one
    three = wc.adam_noise_quantiles(3, (0.9, 0.999))
    assert 1.0 < three[1] < 3.0 and three[-1] <= 3.0 + 1e-6
    assert wc.adam_noise_quantiles(7, (0.9, 0.999))[1] > three[1]


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


def test_agreement_is_one_for_the_same_change_and_near_chance_for_independent_ones() -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(100_000, generator=gen), torch.randn(100_000, generator=gen)
    cos, same = wc.agreement(a, a * 3)
    assert abs(cos - 1.0) < 1e-5 and same == 1.0
    cos, same = wc.agreement(a, b)
    assert abs(cos) < 0.02 and abs(same - 0.5) < 0.01
    cos, same = wc.agreement(a, -a)
    assert cos < -0.99 and same == 0.0
