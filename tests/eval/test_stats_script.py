"""The statistics script prints the same numbers as a direct count, for both log formats."""

from __future__ import annotations

import csv
import importlib.util
import json
import random
from pathlib import Path

import pandas as pd
import pytest

from seal.eval.logs import ValidationLogWriter, ValidationRecord

ROOT = Path(__file__).resolve().parents[2]
PARQUET = ROOT / "data" / "bfcl_eval_400.parquet"


def _load_script():
    spec = importlib.util.spec_from_file_location("stats_validation_bfcl", ROOT / "scripts" / "stats_validation_bfcl.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def eval_tasks() -> list[tuple[str, str, str, str]]:
    """(task_id, category, split, first user query) for every eval-parquet row."""
    df = pd.read_parquet(PARQUET, columns=["data_source", "prompt", "extra_info"])
    return [(e["index"], src, e["split"], list(p)[1]["content"])
            for src, p, e in zip(df["data_source"], df["prompt"], df["extra_info"])]


def _direct_count(rows: list[tuple[str, str, float]], split_of: dict[str, str], split: str) -> dict:
    """{category or 'overall': (n_pass, n)} by plain counting (the reference)."""
    out: dict[str, list[int]] = {}
    for tid, cat, score in rows:
        if split != "all" and split_of[tid] != split:
            continue
        for key in (cat, "overall"):
            c = out.setdefault(key, [0, 0])
            c[0] += score >= 1.0
            c[1] += 1
    return {k: tuple(v) for k, v in out.items()}


def _csv_counts(path: Path) -> dict[int, dict[str, tuple[int, int]]]:
    out: dict[int, dict[str, tuple[int, int]]] = {}
    with path.open() as fh:
        for row in csv.DictReader(fh):
            out.setdefault(int(row["step"]), {})[row["category"]] = (int(row["n_pass"]), int(row["n"]))
    return out


@pytest.mark.parametrize("split", ["all", "val", "test"])
def test_our_format_matches_direct_count(tmp_path, eval_tasks, split, capsys):
    rng = random.Random(7)
    writer = ValidationLogWriter(tmp_path / "validation_log")
    truth: dict[int, list[tuple[str, str, float]]] = {}
    for step in (0, 10):
        for tid, cat, sp, _q in rng.sample(eval_tasks, 120):
            score = float(rng.random() < 0.3)
            truth.setdefault(step, []).append((tid, cat, score))
            writer.write(ValidationRecord(task_id=tid, data_source=cat, split=sp, step=step, score=score,
                                          reward=score, valid=bool(score), tags=["pass", "state_mismatch"]))
    split_of = {t[0]: t[2] for t in eval_tasks}
    mod = _load_script()
    out_csv = tmp_path / "s.csv"
    assert mod.main(["--val-dir", str(tmp_path / "validation_log"), "--split", split, "--csv", str(out_csv),
                     "--md", str(tmp_path / "s.md")]) == 0
    got = _csv_counts(out_csv)
    for step, rows in truth.items():
        assert got[step] == _direct_count(rows, split_of, split)
    printed = capsys.readouterr().out
    n_pass, n = _direct_count(truth[10], split_of, split)["overall"]
    assert f"{100 * n_pass / n:.2f} ({n_pass}/{n})" in printed
    assert "state_mismatch" in printed and "state_mismatch" in (tmp_path / "s.md").read_text()


def test_release_format_matches_direct_count(tmp_path, eval_tasks):
    """Hand-made release lines: no split key; some lines even lack task_id (found by query)."""
    rng = random.Random(3)
    val_dir = tmp_path / "validation_log"
    val_dir.mkdir()
    rows = []
    with (val_dir / "20.jsonl").open("w") as fh:
        for i, (tid, cat, _sp, query) in enumerate(eval_tasks[::3]):
            score = float(rng.random() < 0.4)
            rows.append((tid, cat, score))
            line = {"input": f"system prompt text\nuser\n{query}", "output": "assistant ...", "score": score,
                    "step": 20, "reward": score, "data_source": cat}
            if i % 2 == 0:
                line["task_id"] = tid
            fh.write(json.dumps(line) + "\n")
    split_of = {t[0]: t[2] for t in eval_tasks}
    mod = _load_script()
    for split in ("all", "val", "test"):
        out_csv = tmp_path / f"{split}.csv"
        assert mod.main(["--val-dir", str(val_dir), "--parquet", str(PARQUET), "--split", split,
                         "--csv", str(out_csv)]) == 0
        assert _csv_counts(out_csv)[20] == _direct_count(rows, split_of, split)


def test_resumed_duplicates_count_once_and_png_written(tmp_path, eval_tasks):
    writer = ValidationLogWriter(tmp_path / "validation_log")
    tid, cat, sp, _ = eval_tasks[0]
    writer.write(ValidationRecord(task_id=tid, data_source=cat, split=sp, step=0, score=0.0, reward=0.0,
                                  valid=False, error="EnvUnavailableError: down"))
    writer.write(ValidationRecord(task_id=tid, data_source=cat, split=sp, step=0, score=1.0, reward=1.0,
                                  valid=True))
    mod = _load_script()
    out_csv, png = tmp_path / "s.csv", tmp_path / "s.png"
    assert mod.main(["--val-dir", str(tmp_path / "validation_log"), "--csv", str(out_csv), "--png", str(png)]) == 0
    assert _csv_counts(out_csv)[0]["overall"] == (1, 1)
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
