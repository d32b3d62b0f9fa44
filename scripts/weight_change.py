"""How far training moved a model's weights, in units of the learning rate.

Compares two checkpoints of the same model, each a local-backend checkpoint folder
(``experiments/<name>/checkpoints/global_step_N``, its ``model.pt``), a ``model.pt`` itself or a
Hugging Face folder (``*.safetensors``), and prints, over every parameter, the quantiles of
``|w_after - w_before| / lr`` and the share of parameters that moved at least half a step.

Why it is worth a look: AdamW divides the gradient's running mean by its running RMS, so every
parameter moves by about lr a step whatever the gradient's size. After ``k`` updates a parameter
whose gradient kept its sign has moved ``k x lr``; one whose gradient was noise has moved less,
by an amount that depends only on ``k`` and the betas. With ``--updates`` the script prints both
references (the noise one simulated with the same betas) beside the measured median, which says
how much of the updates' movement was a direction and how much was noise.

With ``--compare`` a second run's checkpoint from the same start is read as well, and the script
prints the cosine between the two runs' weight changes and the share of parameters both moved the
same way: 0 and 0.5 for two independent noise walks, higher for a direction both runs found.

    .venv/bin/python scripts/weight_change.py models/warm_start/<name> \\
        experiments/<run>/checkpoints/global_step_3 --lr 4e-5 --updates 3 \\
        [--compare experiments/<other run>/checkpoints/global_step_3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

QUANTILES = (0.1, 0.5, 0.9, 0.99)
SAMPLE = 2_000_000  # torch.quantile's input limit is 16M elements; a random sample is plenty


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """A state dict from a checkpoint folder, a ``model.pt`` or a safetensors folder."""
    if path.is_dir() and (path / "model.pt").is_file():
        path = path / "model.pt"
    if path.is_file():
        return torch.load(path, map_location="cpu", weights_only=True)
    shards = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not shards:
        sys.exit(f"weight_change: error: {path}: no model.pt or *.safetensors there (give a checkpoint folder)")
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for shard in shards:
        weights.update(load_file(str(shard)))
    return weights


def _key(name: str) -> str:
    """Parameter names without the ``model.`` prefix one format has and the other lacks."""
    return name.removeprefix("model.")


def change(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> torch.Tensor:
    """``after - before`` of every parameter both hold, flattened in name order (float32)."""
    b = {_key(k): v for k, v in before.items()}
    a = {_key(k): v for k, v in after.items()}
    shared = sorted(set(a) & set(b))
    if not shared:
        sys.exit("weight_change: error: the two checkpoints share no parameter name (not the same model?)")
    return torch.cat([(a[k].float() - b[k].float()).flatten() for k in shared])


def agreement(one: torch.Tensor, other: torch.Tensor) -> tuple[float, float]:
    """Cosine between two weight changes, and the share of parameters both moved that moved the same way."""
    moved = (one != 0) & (other != 0)
    same = ((one > 0) == (other > 0))[moved].float().mean() if bool(moved.any()) else torch.tensor(float("nan"))
    return float(torch.nn.functional.cosine_similarity(one, other, dim=0)), float(same)


def adam_noise_quantiles(updates: int, betas: tuple[float, float], n: int = 200_000) -> list[float]:
    """The :data:`QUANTILES` of ``|w_k - w_0| / lr`` of AdamW (bias-corrected, no weight decay) fed ``updates`` steps
    of independent standard-normal gradients: how far noise alone moves a parameter."""
    b1, b2 = betas
    gen = torch.Generator().manual_seed(0)
    m, v, w = torch.zeros(n), torch.zeros(n), torch.zeros(n)
    for t in range(1, updates + 1):
        g = torch.randn(n, generator=gen)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        w -= (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + 1e-8)
    return torch.quantile(w.abs(), torch.tensor(QUANTILES)).tolist()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--lr", type=float, required=True, help="the optimizer's learning rate")
    parser.add_argument("--updates", type=int, default=None,
                        help="optimizer steps between the two: prints the noise and kept-sign references")
    parser.add_argument("--compare", type=Path, default=None,
                        help="another run's checkpoint from the same BEFORE: how far the two changes agree")
    parser.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.999), help="AdamW's betas (verl's default)")
    args = parser.parse_args(argv)
    if args.lr <= 0:
        parser.error("--lr must be > 0")
    before = load_weights(args.before)
    signed = change(before, load_weights(args.after))
    delta = signed.abs() / args.lr
    gen = torch.Generator().manual_seed(0)
    sample = delta[torch.randint(delta.numel(), (min(SAMPLE, delta.numel()),), generator=gen)]
    qs = torch.quantile(sample, torch.tensor(QUANTILES)).tolist()
    print(f"{delta.numel() / 1e6:.1f}M parameters; |dw| / lr at quantiles "
          + ", ".join(f"{int(q * 100)}%: {v:.2f}" for q, v in zip(QUANTILES, qs)))
    print(f"moved >= 0.5 lr: {float((delta >= 0.5).float().mean()):.3f} of the parameters; unmoved (< 0.01 lr): "
          f"{float((delta < 0.01).float().mean()):.3f}")
    if args.updates:
        k = args.updates
        noise = adam_noise_quantiles(k, tuple(args.betas))
        print(f"gradients that were pure noise would give (AdamW, betas {args.betas[0]:g}/{args.betas[1]:g}, "
              f"{k} update(s), simulated) " + ", ".join(f"{int(q * 100)}%: {v:.2f}" for q, v in zip(QUANTILES, noise))
              + f"; a sign kept every step gives {k:.2f} lr")
    if args.compare is not None:
        other = change(before, load_weights(args.compare))
        if other.numel() != signed.numel():
            sys.exit(f"weight_change: error: {args.compare} holds other parameters than {args.after}")
        cos, same = agreement(signed, other)
        print(f"against {args.compare}: cosine {cos:.3f}, moved the same way {same:.3f} "
              "(0 and 0.5 for two independent noise walks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
