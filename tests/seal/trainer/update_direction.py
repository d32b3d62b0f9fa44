"""The direction check of the update-direction tests (both backends).

One policy update on a batch of multi-turn responses, each with one advantage on every response
token, should raise the log-probability of the tokens the model wrote (mask 1) when the
advantage is positive and lower it when it is negative, and leave the tokens it did not write
(tool observations, mask 0) mostly alone: they are not trained, they only move through the
weights they share with the trained tokens.

The sabotages are the two bugs the check must catch: the loss sees the advantage with its sign
flipped, or the loss mask inverted (observations trained, model-written tokens not). Each
backend's test applies them at its loss function's inputs and expects the check to fail.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

SABOTAGES: tuple[str | None, ...] = (None, "flip_sign", "flip_mask")

# A trained token's mean log-prob change must exceed this (float noise is ~1e-6 at the test's
# learning rate, the changes ~0.3).
MIN_CHANGE = 0.01
# The untrained tokens' mean |change| must stay below this fraction of the trained tokens'.
# A correct update gives at most ~0.3 on the tests' batches; an inverted mask gives more than 2.
MAX_UNTRAINED_RATIO = 0.5


@dataclass(frozen=True)
class RowChange:
    """One response's log-prob change over an update, split by the loss mask."""

    advantage: float
    trained: float  # mean change over the mask-1 (model-written) tokens
    trained_abs: float  # mean |change| over the mask-1 tokens
    untrained_abs: float  # mean |change| over the mask-0 (observation) tokens

    @property
    def held(self) -> bool:
        """The trained tokens moved with the advantage's sign, clearly, and more than the
        untrained ones."""
        sign = 1.0 if self.advantage > 0 else -1.0
        return (self.trained * sign > MIN_CHANGE
                and self.untrained_abs < MAX_UNTRAINED_RATIO * self.trained_abs)


def row_changes(before: torch.Tensor, after: torch.Tensor, mask: torch.Tensor,
                advantages: Sequence[float]) -> list[RowChange]:
    """``before``/``after``: ``(B, T)`` response log-probs; ``mask``: ``(B, T)`` loss mask (every
    row has both 1 and 0 positions); ``advantages``: one non-zero advantage per row."""
    out = []
    for i, adv in enumerate(advantages):
        delta = (after[i] - before[i]).double()
        m = mask[i].bool()
        out.append(RowChange(advantage=float(adv), trained=float(delta[m].mean()),
                             trained_abs=float(delta[m].abs().mean()), untrained_abs=float(delta[~m].abs().mean())))
    return out


def direction_held(changes: Sequence[RowChange]) -> bool:
    return all(c.held for c in changes)


def describe(changes: Sequence[RowChange]) -> str:
    return "; ".join(f"A={c.advantage:+.3f}: trained {c.trained:+.4f} (|.| {c.trained_abs:.4f}), "
                     f"untrained |.| {c.untrained_abs:.4f}" for c in changes)


def sabotaged(advantages: torch.Tensor, mask: torch.Tensor, sabotage: str | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss inputs as a buggy update would pass them: the advantage negated, or the mask
    inverted over the response (the tests' responses have no padding, so ``1 - mask`` is exact)."""
    if sabotage == "flip_sign":
        return -advantages, mask
    if sabotage == "flip_mask":
        return advantages, 1 - mask
    return advantages, mask
