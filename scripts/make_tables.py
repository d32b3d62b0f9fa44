#!/usr/bin/env python
"""Paper-style tables and plots from a set of runs, next to the SEAL paper's published numbers.

Each ``--run NAME=DIR`` is an experiment directory holding ``validation_log/<step>.jsonl``
(or ``repeat_<k>/validation_log/`` from ``seal eval --repeats k``: then the mean over repeats is
reported with its std), and optionally ``diagnostic_stats/epoch_<e>.json`` and ``metrics.jsonl``.
Row names that match the paper's rows are compared with them: ``backbone``, ``vanilla_rl``,
``seal`` (Table 1) and ``wo_env_adaptation``, ``wo_apatch``, ``wo_closed_loop`` (Table 3).

Each ``--ood NAME=DIR`` is a Table 2 folder written by ``scripts/ood_eval.py`` (BFCL V4 and
τ²-bench score files; rows ``backbone``, ``vanilla_rl``, ``seal``); then ``table2.md/.csv`` too.

Writes to ``--out``: ``table1.md/.csv``, ``table3.md/.csv``, ``runs.md`` (every run),
``pass_rate_over_steps.png``, ``tag_fractions.png``, ``apatch_weights.png``, ``reward_curve.png``
(each plot only when some run has its data).

    python scripts/make_tables.py --backbone qwen2.5-7b-instruct --out reports/qwen7b \
        --run backbone=experiments/eval_qwen7b --run vanilla_rl=experiments/vanilla_rl \
        --run seal=experiments/SEAL --run wo_apatch=experiments/wo_apatch \
        --ood backbone=reports/ood/qwen7b --ood seal=reports/ood/SEAL
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from seal.eval import ood  # noqa: E402
from seal.eval import paper_numbers as paper  # noqa: E402
from seal.eval.logs import read_log_dir  # noqa: E402
from seal.eval.stats import (  # noqa: E402
    CATEGORY_ORDER,
    OVERALL,
    SHORT_NAMES,
    category_mean,
    dedupe_latest,
    mean_std,
    pass_counts,
    tag_distribution,
)

log = logging.getLogger("make_tables")
COLS = ("avg", *CATEGORY_ORDER)
COL_NAMES = {"avg": "Avg", **SHORT_NAMES}
TABLE1_ROWS = ("backbone", "vanilla_rl", "seal")
TABLE3_ROWS = ("backbone", "vanilla_rl", "wo_env_adaptation", "wo_apatch", "wo_closed_loop", "seal")
WEIGHT_KEY = re.compile(r"dynamic_tag_weight/(.+)$")


@dataclass
class Run:
    """One experiment: per-step pass rates (percent) per column, mean and std over repeats."""

    name: str
    path: Path
    steps: dict[int, dict[str, tuple[float, float]]] = field(default_factory=dict)
    n: dict[int, dict[str, int]] = field(default_factory=dict)
    val_tags: dict[int, dict[str, int]] = field(default_factory=dict)
    repeats: int = 1

    def at(self, step: int) -> dict[str, tuple[float, float]]:
        return self.steps[step]


def log_dirs(run_dir: Path) -> list[Path]:
    if run_dir.is_file():
        raise NotADirectoryError(f"{run_dir} is a file; pass the experiment folder (the one holding validation_log/)")
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such folder; pass an experiment folder (experiments/<name>)")
    direct = run_dir / "validation_log"
    if direct.is_dir():
        return [direct]
    reps = sorted(p / "validation_log" for p in run_dir.glob("repeat_*") if (p / "validation_log").is_dir())
    if not reps:
        raise FileNotFoundError(f"{run_dir}: no validation_log/ (or repeat_*/validation_log/) directory")
    return reps


def _split_records(records: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    recs = dedupe_latest(records)
    return recs if split == "all" else [r for r in recs if r.get("split") == split]


def load_run(name: str, run_dir: Path, split: str) -> Run:
    """Pass rates (percent) per step: each column's mean and std over the run's repeats."""
    run = Run(name, run_dir)
    per_rep = [read_log_dir(d) for d in log_dirs(run_dir)]
    run.repeats = len(per_rep)
    steps = sorted(set.intersection(*(set(s) for s in per_rep)))
    for step in steps:
        values: dict[str, list[float]] = {c: [] for c in COLS}
        for rep in per_rep:
            counts = pass_counts(_split_records(rep[step], split))
            if counts[OVERALL].errored:
                log.warning("run %s, step %d: %d errored episodes (LLM or environment failure) left out of "
                            "the pass rates", name, step, counts[OVERALL].errored)
            if counts[OVERALL].n == 0:
                continue
            values["avg"].append(100 * category_mean(counts))
            for c in CATEGORY_ORDER:
                if c in counts and counts[c].n:
                    values[c].append(100 * counts[c].rate)
            run.n[step] = {c: counts[c].n for c in counts}
        run.steps[step] = {c: mean_std(v) for c, v in values.items() if v}
        run.val_tags[step] = dict(tag_distribution(_split_records(per_rep[0][step], split)))
    run.steps = {s: v for s, v in run.steps.items() if v}
    if not run.steps:
        raise ValueError(f"run {name!r} ({run_dir}) has no validation records for split {split!r}")
    return run


def pick_step(run: Run, how: str) -> int:
    """``last``, ``best`` (highest Avg; the paper does not say which it reports) or a step."""
    if how == "last":
        return max(run.steps)
    if how == "best":
        return max(run.steps, key=lambda s: run.steps[s]["avg"][0])
    step = int(how)
    if step not in run.steps:
        raise ValueError(f"run {run.name!r} has no validation step {step}; it has {sorted(run.steps)}")
    return step


def _fmt(mean: float, std: float, repeats: int) -> str:
    if math.isnan(mean):
        return "-"
    return f"{mean:.2f} ± {std:.2f}" if repeats > 1 else f"{mean:.2f}"


def table_rows(rows: tuple[str, ...], runs: dict[str, Run], reference: dict[str, dict[str, float]],
               how: str) -> list[dict[str, Any]]:
    """One dict per (row, column): ours, paper, diff, gain over the backbone (ours and paper)."""
    out = []
    base_run = runs.get("backbone")
    for row in rows:
        run = runs.get(row)
        step = pick_step(run, how) if run else None
        base_step = pick_step(base_run, how) if base_run else None
        for col in COLS:
            ours, std = run.at(step).get(col, (math.nan, math.nan)) if run else (math.nan, math.nan)
            ref = reference.get(row, {}).get(col, math.nan)
            base_ours = base_run.at(base_step).get(col, (math.nan, 0))[0] if base_run else math.nan
            out.append({
                "row": row, "label": paper.ROW_LABELS.get(row, row), "column": col, "step": step,
                "ours": ours, "ours_std": std, "repeats": run.repeats if run else 0,
                "n": (run.n[step].get(col, run.n[step].get(OVERALL)) if run else 0) if col != "avg" else
                     (run.n[step].get(OVERALL) if run else 0),
                "paper": ref, "diff": ours - ref,
                "gain": ours - base_ours if row != "backbone" else math.nan,
                "paper_gain": ref - reference.get("backbone", {}).get(col, math.nan) if row != "backbone" else math.nan,
            })
    return out


def to_markdown(title: str, cells: list[dict[str, Any]], note: str) -> str:
    lines = [f"### {title}", "", note, "",
             "| Setting | " + " | ".join(COL_NAMES[c] for c in COLS) + " | Gain (Avg) |",
             "|---|" + "---|" * (len(COLS) + 1)]
    rows: dict[str, list[dict[str, Any]]] = {}
    for c in cells:
        rows.setdefault(c["row"], []).append(c)
    for row, cs in rows.items():
        label = cs[0]["label"] + ("" if cs[0]["repeats"] else " (not run)")
        parts = []
        for c in cs:
            ours = _fmt(c["ours"], c["ours_std"], c["repeats"])
            paper_txt = "-" if math.isnan(c["paper"]) else f"{c['paper']:.2f}"
            diff = "" if math.isnan(c["diff"]) else f", Δ {c['diff']:+.2f}"
            parts.append(f"{ours} (paper {paper_txt}{diff})")
        avg = next(c for c in cs if c["column"] == "avg")
        gain = "-" if math.isnan(avg["gain"]) else f"{avg['gain']:+.2f}"
        pgain = "" if math.isnan(avg["paper_gain"]) else f" (paper {avg['paper_gain']:+.2f})"
        lines.append(f"| {label} | " + " | ".join(parts) + f" | {gain}{pgain} |")
    return "\n".join(lines) + "\n"


def write_csv(path: Path, cells: list[dict[str, Any]]) -> None:
    keys = ["row", "label", "column", "step", "ours", "ours_std", "repeats", "n", "paper", "diff", "gain", "paper_gain"]
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for c in cells:
            w.writerow({k: (f"{c[k]:.4f}" if isinstance(c[k], float) and not math.isnan(c[k]) else
                            ("" if isinstance(c[k], float) else c[k])) for k in keys})


def runs_markdown(runs: dict[str, Run], how: str, split: str) -> str:
    lines = [f"### All runs (split: {split}, step: {how})", "",
             "| Run | step | " + " | ".join(COL_NAMES[c] for c in COLS) + " | n | repeats | path |",
             "|---|---|" + "---|" * (len(COLS) + 3)]
    for name, run in runs.items():
        step = pick_step(run, how)
        vals = [_fmt(*run.at(step).get(c, (math.nan, math.nan)), run.repeats) for c in COLS]
        lines.append(f"| {name} | {step} | " + " | ".join(vals)
                     + f" | {run.n[step].get(OVERALL, 0)} | {run.repeats} | {run.path} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- training-side data


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    log.warning("%s: skipping a malformed line", path)
    return rows


def epoch_dumps(run_dir: Path) -> list[dict[str, Any]]:
    """``diagnostic_stats/epoch_<e>.json`` records, by global step."""
    dumps = []
    for p in (run_dir / "diagnostic_stats").glob("epoch_*.json"):
        try:
            dumps.append(json.loads(p.read_text()))
        except json.JSONDecodeError:
            log.warning("%s: not JSON, skipped", p)
    return sorted(dumps, key=lambda d: (d.get("global_step", 0), d.get("epoch", 0)))


def training_tag_fractions(run_dir: Path) -> dict[int, dict[str, float]]:
    """Tag fractions of the training rollouts per epoch dump (x = global step)."""
    out = {}
    for d in epoch_dumps(run_dir):
        counts = {t: float(s.get("count", 0)) for t, s in (d.get("tags") or {}).items()}
        total = sum(counts.values())
        if total:
            out[int(d.get("global_step", 0))] = {t: c / total for t, c in counts.items()}
    return out


def apatch_weights(run_dir: Path) -> dict[int, dict[str, float]]:
    """Dynamic A-Patch tag weights per step: ``metrics.jsonl``, else the epoch dumps."""
    out: dict[int, dict[str, float]] = {}
    for row in read_jsonl(run_dir / "metrics.jsonl"):
        ws = {m.group(1): float(v) for k, v in row.items() if (m := WEIGHT_KEY.search(k))}
        if ws and "step" in row:
            out[int(row["step"])] = ws
    if not out:
        for d in epoch_dumps(run_dir):
            if d.get("dynamic_tag_weights"):
                out[int(d.get("global_step", 0))] = {t: float(w) for t, w in d["dynamic_tag_weights"].items()}
    return out


def reward_curve(run_dir: Path, key: str) -> dict[int, float]:
    return {int(r["step"]): float(r[key]) for r in read_jsonl(run_dir / "metrics.jsonl") if key in r and "step" in r}


# --------------------------------------------------------------------------- plots


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _integer_steps(ax: Any, steps: Iterable[int]) -> None:
    """Integer step ticks over the steps of every run, also in a panel that has only one point."""
    from matplotlib.ticker import MaxNLocator

    uniq = sorted(set(steps))
    if not uniq:
        return
    lo, hi = (uniq[0] - 1, uniq[0] + 1) if len(uniq) == 1 else (uniq[0], uniq[-1])
    pad = 0.05 * (hi - lo)
    ax.set_xlim(lo - pad, hi + pad)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_pass_rates(runs: dict[str, Run], path: Path, split: str) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, len(COLS), figsize=(3.1 * len(COLS), 3.3), dpi=110, sharey=True)
    for ax, col in zip(axes, COLS):
        for i, (name, run) in enumerate(runs.items()):
            steps = [s for s in run.steps if col in run.steps[s]]
            means = [run.steps[s][col][0] for s in steps]
            stds = [run.steps[s][col][1] for s in steps]
            # Shrinking hollow markers keep runs with equal rates visible as concentric rings.
            line = ax.plot(steps, means, marker="o", markersize=4 + 3 * (len(runs) - i),
                           markerfacecolor="none", label=name)[0]
            if run.repeats > 1:
                ax.fill_between(steps, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)],
                                color=line.get_color(), alpha=0.15)
        ax.set_title(COL_NAMES[col])
        ax.set_xlabel("training step")
        _integer_steps(ax, [s for run in runs.values() for s in run.steps])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"pass rate (%), split {split}")
    axes[0].set_ylim(-2, 102)
    axes[-1].legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_series_grid(series: dict[str, dict[int, dict[str, float]]], path: Path, ylabel: str,
                     title: str, stacked: bool) -> None:
    """One panel per run; one line (or stacked area) per key over steps, same colour per key
    in every panel and one shared legend. A single step is drawn as a (stacked) bar."""
    plt = _plt()
    names = list(series)
    keys = sorted({k for data in series.values() for d in data.values() for k in d})
    colours = {k: plt.get_cmap("tab10")(i % 10) for i, k in enumerate(keys)}
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names) + 1.8, 3.4), dpi=110, squeeze=False)
    for ax, name in zip(axes[0], names):
        data = series[name]
        steps = sorted(data)
        ys = {k: [data[s].get(k, 0.0) for s in steps] for k in keys}
        if stacked and len(steps) == 1:
            bottom = 0.0
            for k in keys:
                ax.bar(steps, ys[k], bottom=bottom, color=colours[k], width=0.6)
                bottom += ys[k][0]
        elif stacked:
            ax.stackplot(steps, [ys[k] for k in keys], colors=[colours[k] for k in keys], alpha=0.85)
        else:
            for k in keys:
                if any(k in data[s] for s in steps):
                    ax.plot(steps, ys[k], marker=".", color=colours[k])
        if stacked:
            ax.set_ylim(0, 1)
        ax.set_title(f"{name}: {title}", fontsize=9)
        ax.set_xlabel("step")
        _integer_steps(ax, steps)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=colours[k], linewidth=6 if stacked else 2) for k in keys]
    fig.legend(handles, keys, fontsize=7, loc="center right")
    fig.tight_layout(rect=(0, 0, 1 - 1.7 / (4.2 * len(names) + 1.8), 1))
    fig.savefig(path)
    plt.close(fig)


def plot_rewards(curves: dict[str, dict[int, float]], path: Path, key: str) -> None:
    plt = _plt()

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    for name, c in curves.items():
        steps = sorted(c)
        ax.plot(steps, [c[s] for s in steps], marker=".", label=name)
    ax.set_xlabel("training step")
    _integer_steps(ax, [s for c in curves.values() for s in c])
    ax.set_ylabel(key)
    ax.set_title("training reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def tag_series(runs: dict[str, Run]) -> dict[str, dict[int, dict[str, float]]]:
    """Training tag fractions where a run has epoch dumps, else its validation-log tags."""
    out = {}
    for name, run in runs.items():
        train = training_tag_fractions(run.path)
        if train:
            out[f"{name} (train)"] = train
            continue
        val = {}
        for step, counts in run.val_tags.items():
            total = sum(counts.values())
            if total:
                val[step] = {t: c / total for t, c in counts.items()}
        if val:
            out[f"{name} (validation)"] = val
    return out


# --------------------------------------------------------------------------- Table 2


def parse_ood(specs: list[str]) -> dict[str, Path]:
    folders: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path or name in folders:
            raise ValueError(f"--ood {spec!r}: expected NAME=DIR once per name, e.g. --ood seal=reports/ood/SEAL")
        folders[name] = Path(path)
    return folders


def write_table2(folders: dict[str, Path], out: Path, backbone: str) -> list[str]:
    """``table2.md/.csv`` from the OOD folders, next to the paper's Table 2 for ``backbone``."""
    cells = ood.table2_cells(folders, paper.TABLE2.get(backbone, {}), paper.ROW_LABELS)
    note = (f"Ours: BFCL V4 (bfcl-eval's own scorer) and τ²-bench pass^1 (its own runner), percent; paper: "
            f"SEAL Table 2 ({backbone}{'' if backbone in paper.TABLE2 else ': not reported'}); Δ = ours − paper. "
            "V4 Avg and τ² Avg only when all their columns were measured.")
    (out / "table2.md").write_text(ood.table2_markdown(cells, note))
    ood.write_table2_csv(out / "table2.csv", cells)
    return ["table2.md", "table2.csv"]


# --------------------------------------------------------------------------- main


def parse_runs(specs: list[str]) -> dict[str, Path]:
    runs: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"--run {spec!r}: expected NAME=DIR, e.g. --run seal=experiments/SEAL")
        if name in runs:
            raise SystemExit(f"--run {name!r} given twice")
        runs[name] = Path(path)
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="append", default=[], required=True, help="NAME=DIR (repeatable)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--backbone", default="qwen2.5-7b-instruct", choices=sorted(paper.TABLE1),
                    help="which backbone's Table 1 rows to compare with")
    ap.add_argument("--split", choices=["all", "val", "test"], default="all",
                    help="tasks to count (the records' split field); the paper reports 400 tasks")
    ap.add_argument("--step", default="last", help="last, best (highest Avg) or a step number")
    ap.add_argument("--reward-key", default="seal/reward_mean", help="metrics.jsonl key of the reward curve")
    ap.add_argument("--ood", action="append", default=[],
                    help="NAME=DIR: a Table 2 folder from scripts/ood_eval.py (repeatable)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    try:
        return run(args)
    except (OSError, ValueError, KeyError) as exc:
        print(f"make_tables: {exc}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace) -> int:
    """Read the runs, write the tables and figures under ``args.out``."""
    runs = {name: load_run(name, path, args.split) for name, path in parse_runs(args.run).items()}
    args.out.mkdir(parents=True, exist_ok=True)
    note = (f"Ours: pass rate (%) on split `{args.split}` at step `{args.step}`; paper: SEAL Table "
            "{t} ({b}, 400 held-in tasks); Δ = ours − paper. Gain = Avg − backbone Avg.")
    t1 = table_rows(TABLE1_ROWS, runs, paper.TABLE1[args.backbone], args.step)
    t3 = table_rows(TABLE3_ROWS, runs, paper.TABLE3, args.step)
    (args.out / "table1.md").write_text(to_markdown("Table 1: BFCL V3 multi-turn", t1,
                                                     note.format(t=1, b=args.backbone)))
    (args.out / "table3.md").write_text(to_markdown("Table 3: ablations", t3,
                                                     note.format(t=3, b="qwen2.5-7b-instruct")))
    write_csv(args.out / "table1.csv", t1)
    write_csv(args.out / "table3.csv", t3)
    (args.out / "runs.md").write_text(runs_markdown(runs, args.step, args.split))
    written = ["table1.md", "table1.csv", "table3.md", "table3.csv", "runs.md"]

    plot_pass_rates(runs, args.out / "pass_rate_over_steps.png", args.split)
    written.append("pass_rate_over_steps.png")
    tags = tag_series(runs)
    if tags:
        plot_series_grid(tags, args.out / "tag_fractions.png", "fraction of turn tags", "tag fractions", True)
        written.append("tag_fractions.png")
    weights = {n: w for n, r in runs.items() if (w := apatch_weights(r.path))}
    if weights:
        plot_series_grid(weights, args.out / "apatch_weights.png", "A-Patch weight", "dynamic tag weights", False)
        written.append("apatch_weights.png")
    rewards = {n: c for n, r in runs.items() if (c := reward_curve(r.path, args.reward_key))}
    if rewards:
        plot_rewards(rewards, args.out / "reward_curve.png", args.reward_key)
        written.append("reward_curve.png")
    if args.ood:
        written += write_table2(parse_ood(args.ood), args.out, args.backbone)
    print((args.out / "table1.md").read_text())
    print((args.out / "runs.md").read_text())
    print("wrote: " + ", ".join(str(args.out / w) for w in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
