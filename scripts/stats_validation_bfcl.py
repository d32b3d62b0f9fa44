#!/usr/bin/env python
"""Pass rates per BFCL category and validation step, from a validation-log directory.

Reads every ``<step>.jsonl`` in ``--val-dir``: this project's logs and the SEAL release's format
(``input``/``output``/``score``/``step``/``reward``/``task_id``/``data_source``). Prints, per
step, each category's ``pass_rate (n_pass/n)`` (a task passes when its score is >= 1) and the
overall, then the failure-tag distribution per step when the logs carry tags. Episodes whose LLM
or environment failed (``seal.eval.logs.is_errored``) are not scored: they are left out of
``n`` and counted apart (``+k errored`` in a cell, and a line per step).

``--split val|test|all`` selects tasks by the eval parquet's ``extra_info.split`` (the eval
parquet mixes 25 val + 75 test tasks per category; report them apart). Records that carry
their own ``split`` use it; others are looked up in ``--parquet`` by task id.

    python scripts/stats_validation_bfcl.py --val-dir experiments/quickstart/validation_log \
        --split val --md stats.md --csv stats.csv --png stats.png
"""

from __future__ import annotations

import argparse
import csv
import logging
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from seal.eval.logs import read_log_dir  # noqa: E402
from seal.eval.stats import (  # noqa: E402
    OVERALL,
    PassCount,
    dedupe_latest,
    order_categories,
    pass_counts,
    tag_distribution,
)
from seal.eval.taskinfo import RecordIdentifier, bfcl_jsonl_index, merge_indexes, parquet_index  # noqa: E402

DEFAULT_PARQUET = ROOT / "data" / "bfcl_eval_400.parquet"
log = logging.getLogger("stats_validation_bfcl")


def load_steps(val_dir: Path, identifier: RecordIdentifier, split: str) -> dict[int, list[dict[str, Any]]]:
    """``{step: records}`` annotated with task/category/split, de-duplicated and split-filtered."""
    out: dict[int, list[dict[str, Any]]] = {}
    for step, records in read_log_dir(val_dir).items():
        recs = dedupe_latest([identifier.annotate(r) for r in records])
        if split != "all":
            unknown = sum(1 for r in recs if not r.get("split"))
            if unknown:
                log.warning("step %d: %d records have no known split and are left out of "
                            "--split %s (pass --parquet)", step, unknown, split)
            recs = [r for r in recs if r.get("split") == split]
        out[step] = recs
    return out


def compute(steps: dict[int, list[dict[str, Any]]]) -> dict[int, dict[str, PassCount]]:
    return {step: pass_counts(recs) for step, recs in steps.items()}


def columns_of(table: dict[int, dict[str, PassCount]]) -> list[str]:
    cats = order_categories({c for counts in table.values() for c in counts if c != OVERALL})
    return cats + [OVERALL]


def format_text(table: dict[int, dict[str, PassCount]]) -> str:
    cols = columns_of(table)
    rows = [["step", *cols]]
    for step, counts in table.items():
        rows.append([str(step), *(counts.get(c, PassCount(0, 0)).cell() for c in cols)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols) + 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)


def format_markdown(table: dict[int, dict[str, PassCount]], tags: dict[int, dict[str, int]]) -> str:
    cols = columns_of(table)
    lines = ["| step | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for step, counts in table.items():
        cells = [counts.get(c, PassCount(0, 0)).cell() for c in cols]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    if any(tags.values()):
        names = sorted({t for d in tags.values() for t in d})
        lines += ["", "Failure tags per step (count, fraction of tagged turns):", "",
                  "| step | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
        for step, dist in tags.items():
            total = sum(dist.values()) or 1
            lines.append(f"| {step} | " + " | ".join(
                f"{dist.get(t, 0)} ({dist.get(t, 0) / total:.2f})" for t in names) + " |")
    return "\n".join(lines) + "\n"


def format_tags(tags: dict[int, dict[str, int]]) -> str:
    lines = []
    for step, dist in tags.items():
        total = sum(dist.values())
        if not total:
            continue
        parts = ", ".join(f"{t} {n} ({n / total:.2f})" for t, n in sorted(dist.items(), key=lambda kv: -kv[1]))
        lines.append(f"step {step}: {parts}")
    return "\n".join(lines)


def write_csv(path: Path, table: dict[int, dict[str, PassCount]], split: str) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["step", "split", "category", "n_pass", "n", "pass_rate", "errored"])
        for step, counts in table.items():
            for cat, pc in counts.items():
                w.writerow([step, split, cat, pc.n_pass, pc.n, f"{pc.rate:.6f}" if pc.n else "", pc.errored])


def write_png(path: Path, table: dict[int, dict[str, PassCount]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = list(table)
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    cols = columns_of(table)
    for i, cat in enumerate(cols):
        ys = [100 * table[s][cat].rate if cat in table[s] and table[s][cat].n else float("nan") for s in steps]
        style = dict(color="black", linestyle="--", linewidth=2) if cat == OVERALL else {}
        # Shrinking markers keep coinciding points visible as concentric rings.
        size = 4 + 2 * (len(cols) - i)
        ax.plot(steps, ys, marker="o", markersize=size, markerfacecolor="none" if cat != OVERALL else None,
                label=cat.replace("multi_turn_", ""), **style)
    ax.set_xlabel("validation step")
    ax.set_ylabel("pass rate (%)")
    ax.set_ylim(-2, 102)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    if len(steps) == 1:
        ax.set_xticks(steps)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def build_identifier(parquet: Path | None, bfcl_jsonl: list[Path]) -> RecordIdentifier:
    indexes = []
    if parquet is not None:
        indexes.append(parquet_index(parquet))
    if bfcl_jsonl:
        indexes.append(bfcl_jsonl_index(bfcl_jsonl))
    return RecordIdentifier(merge_indexes(*indexes))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--val-dir", required=True, type=Path, help="directory of <step>.jsonl logs")
    ap.add_argument("--parquet", type=Path, default=None,
                    help=f"SEAL eval parquet for splits/categories (default {DEFAULT_PARQUET.relative_to(ROOT)} if present)")
    ap.add_argument("--bfcl-jsonl", type=Path, nargs="*", default=[],
                    help="BFCL question JSONL files, to recognise release-format lines without task_id")
    ap.add_argument("--split", choices=["val", "test", "all"], default="all")
    ap.add_argument("--csv", type=Path, help="write per-step, per-category counts as CSV")
    ap.add_argument("--md", type=Path, help="write the table (and tag distributions) as Markdown")
    ap.add_argument("--png", type=Path, help="plot pass rate per category over steps")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    try:
        return run(args)
    except (OSError, ValueError, KeyError) as exc:
        print(f"stats_validation_bfcl: {exc}", file=sys.stderr)
        return 1


def format_errored(table: dict[int, dict[str, PassCount]]) -> str:
    """One line per step with errored episodes (not scored: the LLM or environment failed)."""
    return "\n".join(f"step {step}: {counts[OVERALL].errored} errored episodes (LLM or environment failure), "
                     "left out of the pass rates" for step, counts in table.items() if counts[OVERALL].errored)


def run(args: argparse.Namespace) -> int:
    for flag, path in (("--parquet", args.parquet), *(("--bfcl-jsonl", p) for p in args.bfcl_jsonl)):
        if path is not None and not path.is_file():
            raise FileNotFoundError(f"{flag} {path}: no such file")
    parquet = args.parquet or (DEFAULT_PARQUET if DEFAULT_PARQUET.exists() else None)
    identifier = build_identifier(parquet, args.bfcl_jsonl)
    steps = load_steps(args.val_dir, identifier, args.split)
    if not steps:
        print(f"stats_validation_bfcl: no <step>.jsonl files in {args.val_dir}", file=sys.stderr)
        return 1
    table = compute(steps)
    tags = {s: dict(tag_distribution(recs)) for s, recs in steps.items()}
    print(f"split: {args.split}")
    print(format_text(table))
    errored = format_errored(table)
    if errored:
        print("\nnot scored:")
        print(errored)
    tag_text = format_tags(tags)
    if tag_text:
        print("\nfailure tags per step:")
        print(tag_text)
    if args.csv:
        write_csv(args.csv, table, args.split)
    if args.md:
        args.md.write_text(format_markdown(table, tags))
    if args.png:
        write_png(args.png, table, f"{args.val_dir.parent.name or args.val_dir} ({args.split})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
