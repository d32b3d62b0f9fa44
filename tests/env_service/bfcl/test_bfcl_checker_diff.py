"""Differential test: ``check_episode`` against bfcl-eval's own ``multi_turn_checker``.

For every one of the 800 tasks: the oracle plus seeded perturbations (dropped, duplicated,
reordered, shifted, changed-argument, extra, positional and split calls). BFCL's checker keeps
instances in its module ``globals()``; each run gets a unique identifier-safe model name and its
keys are deleted afterwards.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import random
import re
from collections import Counter

import pytest
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

from env_service.bfcl.checker import check_episode
from env_service.bfcl.executor import backend_class
from env_service.kit import parse_call
from env_service.bfcl.tasks import CATEGORIES
from seal_shared.types import FailureTag

_names = itertools.count()


def bfcl_verdict(model_turns, task) -> tuple[bool, str | None]:
    """BFCL's (valid, error_type), with the eval runner's turn-count rule in front."""
    if len(model_turns) != len(task.gt_turns):
        return False, "multi_turn:force_terminated"
    name = f"diff{next(_names)}"
    try:
        result = multi_turn_checker(model_turns, task.gt_turns, task.entry, task.category, name)
    finally:
        for suffix in ("_eval", "_ground_truth_eval"):
            for cls in task.involved_classes:
                key = re.sub(r"[-./:]", "_", f"{name}{suffix}_{task.id}_{cls}_instance")
                vars(multi_turn_utils).pop(key, None)
    return result["valid"], result.get("error_type")


def _rebuild(name: str, args: tuple, kwargs: dict) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def _calls(turns):
    return [(k, s, i) for k, turn in enumerate(turns) for s, step in enumerate(turn) for i, _ in enumerate(step)]


def perturb(kind: str, task, rng: random.Random) -> list[list[list[str]]]:
    turns = [[list(turn)] if turn else [] for turn in task.gt_turns]
    slots = _calls(turns)
    if not slots:
        return turns
    k, s, i = rng.choice(slots)
    step = turns[k][s]
    if kind == "drop":
        step.pop(i)
    elif kind == "duplicate":
        step.insert(i, step[i])
    elif kind == "reorder":
        rng.shuffle(step)
    elif kind == "shift":
        call = step.pop(i)
        target = min(k + 1, len(turns) - 1) if k + 1 < len(turns) else max(k - 1, 0)
        turns[target].append([call])
    elif kind == "change_arg":
        p = parse_call(step[i])
        kwargs = {key: (v + "_x" if isinstance(v, str) else v + 1 if type(v) in (int, float) else v)
                  for key, v in p.kwargs.items()}
        args = tuple(a + "_x" if isinstance(a, str) else a for a in p.args)
        step[i] = _rebuild(p.name, args, kwargs)
    elif kind == "extra":
        donor = rng.choice([c for turn in task.gt_turns for c in turn])
        turns[k].append([donor])
    elif kind == "positional":
        p = parse_call(step[i])
        method = next(getattr(backend_class(c), p.name) for c in task.involved_classes
                      if hasattr(backend_class(c), p.name))
        order = [n for n in inspect.signature(method).parameters if n != "self"]
        bound = dict(zip(order, p.args), **p.kwargs)
        positional = []
        for n in order:  # the longest prefix of parameters the call supplies becomes positional
            if n not in bound:
                break
            positional.append(bound.pop(n))
        step[i] = _rebuild(p.name, tuple(positional), bound)
    elif kind == "split":
        turns[k] = [[c] for c in itertools.chain.from_iterable(turns[k])]
    elif kind == "clear_turn":
        turns[k] = []
    elif kind == "truncate":
        turns = turns[:-1]
    return turns


KINDS = ("drop", "duplicate", "reorder", "shift", "change_arg", "extra", "positional", "split", "clear_turn")


@pytest.mark.slow  # about 15 s of CPU: 4,800 trajectories, each judged twice
def test_checker_agrees_with_bfcl_on_oracles_and_perturbations(store):
    rng = random.Random(20240917)
    disagreements = []
    outcomes: Counter = Counter()
    for category in CATEGORIES:
        for tid in store.ids(category=category):
            task = store.get(tid)
            variants = [("oracle", [[turn] if turn else [] for turn in task.gt_turns])]
            variants += [(kind, perturb(kind, task, rng)) for kind in rng.sample(KINDS, 5)]
            for kind, turns in variants:
                ours = check_episode(copy.deepcopy(turns), task.gt_turns, task.entry)
                theirs = bfcl_verdict(turns, task)
                outcomes[(kind, theirs[0])] += 1
                if (ours.valid, ours.error_type) != theirs:
                    disagreements.append((tid, kind, (ours.valid, ours.error_type), theirs))
    assert disagreements == []
    assert not [k for k in vars(multi_turn_utils) if k.startswith("diff")]  # BFCL's cache was cleaned
    assert sum(outcomes.values()) == 800 * 6
    # The perturbations must actually exercise failures, not only passes.
    assert sum(n for (kind, valid), n in outcomes.items() if not valid) > 1000


def test_force_terminated_when_turn_counts_differ(store):
    task = store.get("multi_turn_base_0")
    check = check_episode(perturb("truncate", task, random.Random(0)), task.gt_turns, task.entry)
    assert (check.valid, check.error_type) == (False, "multi_turn:force_terminated")
    assert check.terminated_early
    # The missing last turn counts as empty; the turns the model did play still pass.
    assert check.tags[-1] == FailureTag.EMPTY_TURN_MODEL_RESPONSE
    assert check.tags[:-1] == [FailureTag.PASS] * (len(task.gt_turns) - 1)
