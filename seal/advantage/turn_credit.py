"""Turn credit: an episode's advantage reaches each of its turns only where the diagnosis agrees.

GRPO gives every token of an episode the episode's advantage. In a multi-turn episode that failed
at its third turn, the first two turns (done right, by the diagnosis' own per-turn tags) are pushed
down with the rest; in one that passed, a turn tagged as a failure would be pushed up. With
``seal.advantage.turn_credit`` the tokens of a turn keep the episode's advantage only when its sign
agrees with the turn's verdict (:func:`seal_shared.tags.turn_verdict`):

* a turn done right (``pass``, ``correct_abstention``) keeps a positive advantage and gets 0 for a
  negative one;
* a failed turn keeps a negative advantage and gets 0 for a positive one;
* a turn the diagnosis cannot judge (an excluded or unknown tag, no tag, no turn index) keeps its
  advantage as is.

A token's turn comes from the record: the response mask's runs of model tokens are the episode's
accepted LLM calls, in order, and ``call_turns`` gives each call's ground-truth turn. A row with
more runs than recorded calls (a record without ``call_turns``) is left as is and counted.
Everything here is pure: the input advantages are not modified.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from seal_shared.tags import turn_verdict

__all__ = ["credit_turns", "model_runs"]

METRIC_PREFIX = "seal/turn_credit"


def model_runs(mask_row: torch.Tensor) -> list[tuple[int, int]]:
    """The ``[start, end)`` spans of consecutive non-zero entries of a ``(T,)`` mask: one per LLM call."""
    on = (mask_row != 0).to(torch.int8)
    edges = torch.diff(on, prepend=on.new_zeros(1), append=on.new_zeros(1))
    starts = torch.nonzero(edges == 1).flatten().tolist()
    ends = torch.nonzero(edges == -1).flatten().tolist()
    return list(zip(starts, ends))


def _credit_row(row: torch.Tensor, mask_row: torch.Tensor, call_turns: Sequence[int | None],
                verdicts: Sequence[bool | None]) -> tuple[torch.Tensor, int] | None:
    """The row with its turns credited and the number of tokens zeroed; ``None`` when the mask
    has more model runs than recorded calls (the row cannot be attributed)."""
    runs = model_runs(mask_row)
    if len(runs) > len(call_turns):
        return None
    out, zeroed = row.clone(), 0
    for (start, end), turn in zip(runs, call_turns):
        verdict = verdicts[turn] if turn is not None and 0 <= turn < len(verdicts) else None
        if verdict is None:
            continue
        span = out[start:end]  # a view: zeroing it zeroes the row's copy
        disagree = span < 0 if verdict else span > 0
        zeroed += int(disagree.sum())
        span[disagree] = 0
    return out, zeroed


def credit_turns(advantages: torch.Tensor, response_mask: torch.Tensor,
                 call_turns: Sequence[Sequence[int | None] | None],
                 tags: Sequence[Sequence[str] | None]) -> tuple[torch.Tensor, dict[str, float]]:
    """``advantages`` ``(B, T)`` with each turn credited by its verdict (module docstring).

    ``response_mask`` ``(B, T)``: 1 on the model's own tokens; ``call_turns``: per row, the turn
    of each accepted LLM call; ``tags``: per row, one tag per ground-truth turn (``None`` for a
    row left out or not diagnosed: kept as is). Returns the new advantages and the metrics
    ``zeroed_token_frac`` (of the masked tokens with a non-zero advantage) and ``unattributed_rows``.
    """
    if advantages.shape != response_mask.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} and response_mask {tuple(response_mask.shape)} differ")
    if not len(call_turns) == len(tags) == advantages.shape[0]:
        raise ValueError(f"got {len(call_turns)} call-turn lists and {len(tags)} tag lists for "
                         f"{advantages.shape[0]} advantage rows")
    out = advantages.clone()
    zeroed = unattributed = 0
    for i, (turns, row_tags) in enumerate(zip(call_turns, tags)):
        if not row_tags or not bool((advantages[i] != 0).any()):
            continue
        credited = _credit_row(advantages[i], response_mask[i], list(turns or ()),
                               [turn_verdict(t) for t in row_tags])
        if credited is None:
            unattributed += 1
            continue
        out[i], row_zeroed = credited
        zeroed += row_zeroed
    signal = int(((advantages != 0) & (response_mask != 0)).sum())
    return out, {f"{METRIC_PREFIX}/zeroed_token_frac": zeroed / signal if signal else 0.0,
                 f"{METRIC_PREFIX}/unattributed_rows": float(unattributed)}
