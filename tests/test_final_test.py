"""scripts/final_test.py: the clustered bootstrap behind RL's gain on the held-out test split."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest

from seal.config import REPO_ROOT

_spec = importlib.util.spec_from_file_location("final_test", REPO_ROOT / "scripts" / "final_test.py")
ft = sys.modules["final_test"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ft)

TASKS = [f"t{i:03d}" for i in range(60)]


def _policy(p_of: dict[str, float], episodes: int, rng: random.Random) -> dict[str, list[float]]:
    return {t: [float(rng.random() < p) for _ in range(episodes)] for t, p in p_of.items()}


def test_the_point_estimate_is_the_mean_over_seed_and_task_cells():
    before = {"a": [0.0, 1.0], "b": [0.0, 0.0]}
    after = [{"a": [1.0], "b": [0.0]}, {"a": [1.0], "b": [1.0]}]
    gain = ft.clustered_interval(after, before=before, draws=200)
    # cells: (1 - .5) + (0 - 0) + (1 - .5) + (1 - 0), over 4
    assert gain["mean"] == pytest.approx(0.5) and gain["per_seed"] == pytest.approx([0.25, 0.75])
    assert gain["tasks"] == 2 and gain["seeds"] == 2


def test_a_real_gain_is_seen_and_no_change_is_not():
    rng = random.Random(0)
    p = {t: rng.random() for t in TASKS}
    before = _policy(p, 4, rng)
    same = [_policy(p, 2, rng) for _ in range(3)]
    better = [_policy({t: min(1.0, x + 0.3) for t, x in p.items()}, 2, rng) for _ in range(3)]
    up = ft.clustered_interval(better, before=before)
    flat = ft.clustered_interval(same, before=before)
    assert up["ci95"][0] > 0.1 and flat["ci95"][0] < 0 < flat["ci95"][1]


def test_the_shared_baselines_noise_is_carried():
    """The same runs against a baseline measured once per task with a noisy episode, and against
    one whose every episode scored its mean: the first interval must be wider, since all seeds
    share that one noisy draw."""
    rng = random.Random(1)
    after = [_policy({t: 0.5 for t in TASKS}, 1, rng) for _ in range(3)]
    noisy = {t: [0.0, 1.0] for t in TASKS}
    exact = {t: [0.5, 0.5] for t in TASKS}
    wide = ft.clustered_interval(after, before=noisy)
    narrow = ft.clustered_interval(after, before=exact)
    assert wide["mean"] == pytest.approx(narrow["mean"])
    assert wide["ci95"][1] - wide["ci95"][0] > 1.1 * (narrow["ci95"][1] - narrow["ci95"][0])


def test_tasks_are_clusters():
    """When every seed moves the same tasks, seeds add no information: the interval must be as wide
    as one seed's, not narrower by sqrt(3) as independent (seed, task) pairs would have it."""
    rng = random.Random(2)
    one = _policy({t: 0.5 for t in TASKS}, 1, rng)
    before = {t: [0.5] for t in TASKS}
    copies = ft.clustered_interval([one, one, one], before=before)
    single = ft.clustered_interval([one], before=before)
    width = lambda g: g["ci95"][1] - g["ci95"][0]  # noqa: E731
    assert width(copies) == pytest.approx(width(single), rel=0.15)


def test_two_variants_are_compared_seed_by_seed():
    a = [{t: [0.0] for t in TASKS} for _ in range(3)]
    b = [{t: [1.0 if i % 2 else 0.0] for i, t in enumerate(TASKS)} for _ in range(3)]
    diff = ft.clustered_interval(b, minus=a)
    assert diff["mean"] == pytest.approx(0.5) and diff["ci95"][0] > 0.3
    with pytest.raises(ValueError, match="exactly one"):
        ft.clustered_interval(b)


def test_scores_are_read_from_every_repeat_and_errored_episodes_left_out(tmp_path: Path):
    for r, rows in enumerate([[("x", 1.0, None), ("y", 0.0, None)], [("x", 0.0, None), ("y", 0.0, "LLM down")]]):
        log = tmp_path / f"repeat_{r}" / "validation_log" / "0.jsonl"
        log.parent.mkdir(parents=True)
        log.write_text("".join(json.dumps({"task_id": t, "score": s, "error": e}) + "\n" for t, s, e in rows))
    assert ft.read_scores(tmp_path) == {"x": [1.0, 0.0], "y": [0.0]}
