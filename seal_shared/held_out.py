"""The held-out splits (``test``, and ``eval`` = val + test): read only by a final evaluation.

A test split measures a finished policy only while nothing chose anything by it: not the training
tasks, not the validation tasks, not a checkpoint or a hyperparameter. So a task store answers the
ids of ``test`` or ``eval`` only inside :func:`final_evaluation` (``seal eval --split test`` enters
it); anywhere else the read raises :class:`HeldOutSplitError`, one line that says how to read it.
Every permitted read is logged at WARNING and appended to :data:`READS`, so a run's log and a test
can show what read the test split and why.

The scope is process-wide, not per thread or per task: an in-process environment service answers
on its own event-loop thread, which must see the evaluation's scope as the caller does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

logger = logging.getLogger(__name__)

HELD_OUT_SPLITS: tuple[str, ...] = ("test", "eval")


class HeldOutSplitError(PermissionError):
    """A held-out split was asked for outside a final evaluation."""


@dataclass(frozen=True)
class SplitRead:
    """One permitted read of a held-out split: which environment, which split, for what."""

    env: str
    split: str
    reason: str


READS: list[SplitRead] = []
"""Every permitted read of a held-out split in this process, in order (tests inspect it)."""

_LOCK = threading.Lock()
_REASONS: list[str] = []  # the open final_evaluation scopes, innermost last


@contextmanager
def final_evaluation(reason: str) -> Iterator[None]:
    """Allow reads of the held-out splits while the block runs; ``reason`` (what evaluates, e.g.
    ``"seal eval --split test"``) is logged and recorded with each read."""
    if not reason.strip():
        raise ValueError("final_evaluation needs a reason: what evaluates on the held-out split")
    with _LOCK:
        _REASONS.append(reason)
    try:
        yield
    finally:
        with _LOCK:
            _REASONS.remove(reason)


def final_evaluation_reason() -> str | None:
    """The reason of the innermost open :func:`final_evaluation` scope (``None``: none is open)."""
    with _LOCK:
        return _REASONS[-1] if _REASONS else None


def refusal(env: str, split: str) -> str:
    """The one-line error for reading ``split`` of ``env`` outside a final evaluation."""
    return (f"the {split} split of {env} is held out for a final evaluation (fix: evaluate a finished policy "
            f"with `seal eval --split {split}`, or read it inside seal_shared.held_out.final_evaluation(reason); "
            "train, select and validate on train and val)")


def refuse_outside_final_evaluation(env: str, split: str) -> None:
    """Raise :class:`HeldOutSplitError` if ``split`` is held out and no final evaluation is open
    (no log, no record: for a caller that then reads through a store, which records the read)."""
    if split in HELD_OUT_SPLITS and final_evaluation_reason() is None:
        raise HeldOutSplitError(refusal(env, split))


def check_split_read(env: str, split: str) -> None:
    """What a task store calls before it answers the ids of ``split``: nothing for ``train`` and
    ``val``; for a held-out split, :class:`HeldOutSplitError` outside a final evaluation, and inside
    one a WARNING and a :class:`SplitRead` in :data:`READS`."""
    if split not in HELD_OUT_SPLITS:
        return
    reason = final_evaluation_reason()
    if reason is None:
        raise HeldOutSplitError(refusal(env, split))
    with _LOCK:
        READS.append(SplitRead(env, split, reason))
    logger.warning("reading the %s split of %s for %s", split, env, reason)
