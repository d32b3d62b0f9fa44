"""RL's held-out gain against a baseline measured more than once.

``learning_bench.py --share-before`` compares every seed's validation after training with one
validation before it, so that one measurement's sampling noise is shared by all seeds. When the
same starting policy has been validated several times (the same checkpoint, the same validation
settings, in earlier runs), this pools those episodes into the baseline and bootstraps over
tasks, seeds and the episodes inside each, so the interval carries the baseline's noise too.

    .venv/bin/python scripts/pooled_gain.py \\
        --before experiments/A/validation_log_sampled/0.jsonl experiments/B/validation_log_sampled/0.jsonl \\
        --after experiments/S0/validation_log_sampled/3.jsonl experiments/S1/validation_log_sampled/3.jsonl ...

Each ``--after`` log is one seed's validation after training; each ``--before`` log is one
validation of the starting policy. Scores are the episodes' ``score`` (pass = 1).
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's seal, run as a script
from seal.eval.logs import read_log_file, record_score  # noqa: E402

Scores = dict[str, list[float]]


def read_scores(paths: list[Path]) -> Scores:
    """Task id -> the scores of its episodes, over every log in ``paths``."""
    out: Scores = defaultdict(list)
    for path in paths:
        for record in read_log_file(path):
            out[str(record["task_id"])].append(record_score(record))
    return dict(out)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def pooled_gain(before: Scores, after: list[Scores], *, draws: int = 10_000, seed: int = 0
                ) -> tuple[float, float, float]:
    """Mean over (seed, task) of the after-score minus the pooled before-score, and its 95 %
    interval from a bootstrap that resamples tasks, seeds, and each drawn task's episodes."""
    tasks = sorted(before)
    missing = [t for run in after for t in tasks if not run.get(t)]
    if missing:
        raise ValueError(f"task {missing[0]} has a baseline but no episode after training in one of the --after logs")
    gain = _mean([_mean(run[t]) - _mean(before[t]) for run in after for t in tasks])
    rng = random.Random(seed)

    def resampled(xs: list[float]) -> float:
        return _mean([rng.choice(xs) for _ in xs])

    boots = []
    for _ in range(draws):
        drawn_tasks = [rng.choice(tasks) for _ in tasks]
        drawn_runs = [rng.choice(after) for _ in after]
        diffs = []
        for t in drawn_tasks:
            base = resampled(before[t])
            diffs += [resampled(run[t]) - base for run in drawn_runs]
        boots.append(_mean(diffs))
    boots.sort()
    return gain, boots[int(0.025 * draws)], boots[int(0.975 * draws) - 1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, nargs="+", required=True, help="validation logs of the starting policy")
    ap.add_argument("--after", type=Path, nargs="+", required=True, help="one validation log after training per seed")
    ap.add_argument("--draws", type=int, default=10_000)
    args = ap.parse_args(argv)
    for path in [*args.before, *args.after]:
        if not path.is_file():
            print(f"pooled_gain: {path}: no such validation log", file=sys.stderr)
            return 1
    before = read_scores(args.before)
    after = [read_scores([path]) for path in args.after]
    try:
        gain, low, high = pooled_gain(before, after, draws=args.draws)
    except ValueError as exc:
        print(f"pooled_gain: {exc}", file=sys.stderr)
        return 1
    n_before = sum(len(v) for v in before.values())
    rate_before = sum(sum(v) for v in before.values()) / n_before
    rates_after = [sum(sum(v) for v in run.values()) / sum(len(v) for v in run.values()) for run in after]
    print(f"before: {rate_before:.3f} over {n_before} episodes of {len(before)} tasks ({len(args.before)} logs)")
    print(f"after: {_mean(rates_after):.3f} (per seed {', '.join(f'{r:.3f}' for r in rates_after)})")
    print(f"gain: {gain:+.3f}, 95 % bootstrap over task x seed x episode [{low:+.3f}, {high:+.3f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
