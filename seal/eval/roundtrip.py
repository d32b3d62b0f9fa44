"""Oracle and perturbed trajectories for checking the BFCL export against BFCL's own scorer.

``python -m seal.eval.roundtrip --log-dir D`` writes ``D/0.jsonl``, a validation log whose records carry
ground-truth trajectories and seeded perturbations of them (dropped, duplicated, swapped,
cleared, shifted, split calls; changed string arguments; positional arguments; a missing last
turn), each judged by this project's checker. ``scripts/bfcl_official_eval.sh --selftest``
exports that log, runs ``bfcl evaluate`` and compares the verdicts with :func:`compare`.
"""

from __future__ import annotations

import argparse
import logging
import random
from pathlib import Path
from typing import Any

from seal.episode import EpisodeResult, Evaluation
from seal.eval.export import call_to_keywords, method_parameters
from seal.eval.logs import ValidationLogWriter, ValidationRecord
from seal.rewards import RewardConfig, episode_reward

logger = logging.getLogger(__name__)

PERTURBATIONS = ("oracle", "drop", "dup", "swap", "clear", "strarg", "shift", "positional", "split", "truncate")
CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")


def _rebuild(name: str, args: list[Any], kwargs: dict[str, Any]) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def to_positional(call: str) -> str:
    """The call with its keyword arguments passed by position, where the signature allows."""
    name, kwargs = call_to_keywords(call)
    params = method_parameters().get(name, [])
    if list(kwargs) != params[: len(kwargs)]:
        return call
    return _rebuild(name, list(kwargs.values()), {})


def perturb(gt_turns: list[list[str]], kind: str, rng: random.Random) -> list[list[list[str]]]:
    """``model_turns`` (turn -> step -> calls): the ground truth, one step per turn, changed by ``kind``."""
    turns = [[list(t)] if t else [] for t in gt_turns]
    nonempty = [i for i, t in enumerate(gt_turns) if t]
    k = rng.choice(nonempty) if nonempty else 0
    calls = turns[k][0] if turns and turns[k] else []
    if kind == "drop" and calls:
        calls.pop(rng.randrange(len(calls)))
    elif kind == "dup" and calls:
        calls.append(rng.choice(calls))
    elif kind == "swap" and len(calls) > 1:
        i, j = rng.sample(range(len(calls)), 2)
        calls[i], calls[j] = calls[j], calls[i]
    elif kind == "clear" and turns:
        turns[k] = []
    elif kind == "strarg":
        for idx, c in enumerate(calls):
            name, kwargs = call_to_keywords(c)
            key = next((a for a, v in kwargs.items() if isinstance(v, str)), None)
            if key:
                calls[idx] = _rebuild(name, [], {**kwargs, key: kwargs[key] + "_x"})
                break
    elif kind == "shift" and calls and k + 1 < len(turns):
        moved = calls.pop()
        turns[k + 1] = [[moved]] + turns[k + 1]
    elif kind == "positional":
        turns = [[[to_positional(c) for c in step] for step in turn] for turn in turns]
    elif kind == "split" and len(calls) > 1:
        turns[k] = [calls[:1], calls[1:]]
    elif kind == "truncate":
        turns = turns[:-1]
    elif kind != "oracle":
        logger.debug("perturbation %s does not apply to turn %d; left unchanged", kind, k)
    return [[s for s in turn if s] for turn in turns]


def roundtrip_records(per_category: int, seed: int = 0) -> list[ValidationRecord]:
    """``per_category`` tasks per category, cycling through :data:`PERTURBATIONS`, judged by
    this project's checker."""
    from seal.environment import standing_client

    rng = random.Random(seed)
    client, records = standing_client("bfcl"), []
    categories = client.catalogue().categories
    for cat in CATEGORIES:
        ids = rng.sample([tid for tid, c in categories.items() if c == cat], per_category)
        records += [_judged(client, tid, cat, PERTURBATIONS[n % len(PERTURBATIONS)], rng) for n, tid in enumerate(ids)]
    return records


def _judged(client: Any, tid: str, cat: str, kind: str, rng: random.Random) -> ValidationRecord:
    """Task ``tid``'s ground truth perturbed by ``kind``, judged by the environment's checker."""
    gt_turns, _ = client.oracle(tid)
    turns = perturb(gt_turns, kind, rng)
    evaluation = Evaluation.from_wire({**client.judge(tid, turns), "model_turns": turns})
    result = EpisodeResult(task_id=tid, category=cat, rollout_mode="validate", evaluation=evaluation,
                           terminated_reason=kind)
    reward = episode_reward(result, cfg=RewardConfig(), train=False)
    result = result.with_reward(reward.score, reward.meta)
    return ValidationRecord.from_episode(result, step=0, split=None, generation={}, extra={"perturbation": kind})


def compare(records: list[dict[str, Any]], official: dict[str, tuple[bool, str | None]]) -> list[str]:
    """Disagreements between our verdicts (valid, error_type) and BFCL's, one line each."""
    out = []
    for r in records:
        ours = (bool(r["valid"]), r.get("error_type") if not r["valid"] else None)
        theirs = official.get(r["task_id"])
        if theirs is None:
            out.append(f"{r['task_id']}: not scored by BFCL")
        elif ours != theirs:
            out.append(f"{r['task_id']} ({r.get('extra', {}).get('perturbation', '-')}): ours {ours}, BFCL {theirs}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="write an oracle/perturbed validation log for the BFCL export check")
    ap.add_argument("--log-dir", type=Path, required=True, help="directory to write 0.jsonl into")
    ap.add_argument("--per-category", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    writer = ValidationLogWriter(args.log_dir)
    writer.path_for(0).unlink(missing_ok=True)
    recs = roundtrip_records(args.per_category, args.seed)
    writer.write_many(recs)
    print(f"{len(recs)} trajectories ({sum(r.valid for r in recs)} valid) -> {writer.path_for(0)}")


if __name__ == "__main__":
    main()
