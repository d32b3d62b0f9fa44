"""The final evaluation on the held-out ``test`` split, and the clustered bootstrap that reads it.

Nothing chose anything on ``test``: configurations, learning rates and stopping points are chosen
on ``val``. So this runs once, at the end (``scripts/learning_bench.py --final``), through
``seal eval --split test`` (which declares the read; see ``seal_shared.held_out``):

* the starting policy (the recipe's warm start), greedy once and sampled ``before_repeats`` times;
* each trained run's last checkpoint (exported to a Hugging Face folder), greedy once and sampled
  ``after_repeats`` times.

Gains are means over (seed, task) cells. Their 95 % intervals come from a bootstrap that resamples
the tasks (clusters: every seed's cell of a drawn task comes along), the seeds, and the episodes
within each cell, the shared baseline's included: the runs of all seeds are compared with one
draw of the starting policy, so its noise is the same in every seed's gain and has to be carried
once, not averaged away over seeds.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class PolicyScores:
    """One policy's final evaluation: per task, the greedy score and the sampled episodes' scores."""

    greedy: dict[str, float]
    sampled: dict[str, list[float]]


def export_hf(checkpoint: Path, base_model: Path, out: Path) -> Path:
    """A local-backend checkpoint's weights (``model.pt``) as a Hugging Face folder next to the
    base model's config and tokenizer, for ``seal eval --model``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (out / "config.json").is_file():
        return out
    model = AutoModelForCausalLM.from_pretrained(base_model, torch_dtype=torch.float32)
    model.load_state_dict(torch.load(checkpoint / "model.pt", map_location="cpu", weights_only=True))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base_model).save_pretrained(out)
    return out


def run_eval(model: Path, conf: str, out: Path, *, temperature: float, repeats: int, seed: int,
             overrides: list[str]) -> Path:
    """``seal eval --split test`` of ``model`` with ``conf``'s validation protocol; returns ``out``.
    A finished evaluation (its ``eval_summary.json``) is reused; an interrupted one resumes (``seal
    eval`` keeps the episodes its log already holds)."""
    if (out / "eval_summary.json").is_file():
        logger.info("final test: reusing %s", out)
        return out
    cmd = [sys.executable, "-m", "seal.eval", "--model", str(model), "--conf", conf, "--split", "test",
           "--temperature", str(temperature), "--repeats", str(repeats), "--seed", str(seed), "--out", str(out),
           "--concurrency", "32", "--batch-size", "32", "--no-progress",
           *[f"--set={kv}" for kv in overrides]]
    logger.info("final test: %s", " ".join(cmd[1:]))
    out.mkdir(parents=True, exist_ok=True)
    with (out / "eval.log").open("w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise RuntimeError(f"final test evaluation of {model} failed (exit {rc}); see {out / 'eval.log'}")
    return out


def read_scores(out: Path) -> dict[str, list[float]]:
    """Per task, the scores of its episodes over every repeat of one ``seal eval`` folder (an
    episode that could not be run says nothing about the policy and is left out)."""
    from seal.eval.logs import is_errored

    scores: dict[str, list[float]] = {}
    for log in sorted(out.rglob("validation_log/*.jsonl")):
        for line in log.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if not is_errored(row):
                    scores.setdefault(row["task_id"], []).append(float(row["score"]))
    return scores


def evaluate_policy(model: Path, conf: str, out: Path, *, repeats: int, seed: int, overrides: list[str]
                    ) -> PolicyScores:
    """Greedy once, then ``repeats`` sampled episodes per task (none with ``repeats=0``)."""
    greedy = read_scores(run_eval(model, conf, out / "greedy", temperature=0.0, repeats=1, seed=seed,
                                  overrides=overrides))
    sampled = read_scores(run_eval(model, conf, out / "sampled", temperature=1.0, repeats=repeats, seed=seed,
                                   overrides=overrides)) if repeats > 0 else {}
    return PolicyScores({t: v[0] for t, v in greedy.items()}, sampled)


def _cells(per_seed: list[dict[str, list[float]]], tasks: list[str]) -> np.ndarray:
    """(seeds, tasks, episodes) scores, each cell cut to the fewest episodes any cell has."""
    depth = min(len(s[t]) for s in per_seed for t in tasks)
    return np.array([[s[t][:depth] for t in tasks] for s in per_seed], dtype=float)


def clustered_interval(after: list[dict[str, list[float]]], *, before: dict[str, list[float]] | None = None,
                       minus: list[dict[str, list[float]]] | None = None, draws: int = 4000, seed: int = 0
                       ) -> dict:
    """Mean over (seed, task) of ``after - before`` (RL's gain; ``before`` shared by all seeds) or of
    ``after - minus`` (two variants, seeds paired by position), with a 95 % percentile interval from
    a bootstrap over tasks (clusters), seeds and the episodes within each cell."""
    if (before is None) == (minus is None):
        raise ValueError("give exactly one of before= or minus=")
    tasks = sorted(set.intersection(*(set(s) for s in after + (minus or [])), *([set(before)] if before else [])))
    if not tasks:
        raise ValueError("no task scored in every run")
    a = _cells(after, tasks)
    b = _cells(minus, tasks) if minus is not None else _cells([before], tasks)[0]
    n_seeds, n_tasks = a.shape[0], len(tasks)
    per_cell = a.mean(-1) - b.mean(-1)  # (seeds, tasks); a shared baseline broadcasts over seeds
    rng = np.random.default_rng(seed)
    stats = np.empty(draws)
    for d in range(draws):
        ti = rng.integers(n_tasks, size=n_tasks)
        si = rng.integers(n_seeds, size=n_seeds)
        cell_a = _resampled_means(a[si][:, ti], rng)
        if minus is not None:
            cell_b = _resampled_means(b[si][:, ti], rng)
        else:
            cell_b = _resampled_means(b[None, ti], rng)
        stats[d] = (cell_a - cell_b).mean()
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return {"mean": float(per_cell.mean()), "ci95": [float(lo), float(hi)], "tasks": n_tasks, "seeds": n_seeds,
            "per_seed": [float(x) for x in per_cell.mean(-1)]}


def _resampled_means(cells: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each cell's mean over its episodes drawn again with replacement (one draw per cell)."""
    depth = cells.shape[-1]
    if depth == 1:
        return cells[..., 0]
    pick = rng.integers(depth, size=cells.shape)
    return np.take_along_axis(cells, pick, axis=-1).mean(-1)
